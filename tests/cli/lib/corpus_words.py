#!/usr/bin/python3
"""The share of a generated text's words that are words of the corpus.

  corpus_words.py CORPUS_FILE GENERATED_FILE [--min N]

A word is a maximal run of letters (A-Z, a-z, and the apostrophe inside a word), compared
case-insensitively; the corpus vocabulary is every word of CORPUS_FILE. Prints
"words: K of N generated words (P%) are corpus words; distinct: ..." and exits 1 when the
share is below --min (a fraction, default 0: report only) or the text has no word.
"""
import re
import sys

WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")


def words(text):
    return [w.lower() for w in WORD.findall(text)]


def main(argv):
    if len(argv) not in (3, 5) or (len(argv) == 5 and argv[3] != "--min"):
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8", errors="replace") as f:
        vocab = set(words(f.read()))
    with open(argv[2], encoding="utf-8", errors="replace") as f:
        gen = words(f.read())
    if not gen:
        print("words: the generated text has no word")
        return 1
    known = sum(1 for w in gen if w in vocab)
    distinct = set(gen)
    share = known / len(gen)
    print(f"words: {known} of {len(gen)} generated words ({100 * share:.1f}%) are corpus words; "
          f"distinct: {sum(1 for w in distinct if w in vocab)} of {len(distinct)}; "
          f"corpus vocabulary {len(vocab)} words")
    minimum = float(argv[4]) if len(argv) == 5 else 0.0
    return 0 if share >= minimum else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
