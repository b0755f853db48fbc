// `parm tokenizer train`: a SentencePiece tokenizer (BPE or unigram) trained on a corpus;
// `parm tokenizer check`: decode(encode(text)) == text over a whole corpus.
// `parm prepare-data`: a corpus tokenized once into a prepared dataset (data/prepared_format.h).
// They run on one process (world rank 0; other ranks return at once).
#include <cstdio>

#include "cli_common.h"
#include "data/corpus.h"
#include "data/prepare.h"
#include "data/prepared_dataset.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace parm::cli {
namespace {

struct TokenizerFlags {
  std::string corpus = "kjv", out, type = "bpe", tokenizer;
  int32_t vocab = 8192;
  int threads = 1;
};

int run_tokenizer_train(const TokenizerFlags& f) {
  if (world_rank() != 0) return 0;
  PARM_CONFIG_CHECK(!f.out.empty(), "parm tokenizer train needs --out FILE.model");
  data::SentencePieceOptions o;
  o.model_type = f.type;
  o.vocab = f.vocab;
  o.threads = f.threads;
  const double t0 = now_us();
  const auto t = data::train_tokenizer(f.corpus, o, f.out);
  std::printf("tokenizer %s: %s %s, trained on %s in %.1f s\n", f.out.c_str(), f.type.c_str(),
              t->describe().c_str(), f.corpus.c_str(), (now_us() - t0) / 1e6);
  return 0;
}

int run_tokenizer_check(const TokenizerFlags& f) {
  if (world_rank() != 0) return 0;
  PARM_CONFIG_CHECK(!f.tokenizer.empty(), "parm tokenizer check needs --tokenizer byte|FILE");
  const auto t = data::load_tokenizer(f.tokenizer);
  const std::string text = data::read_corpus_text(f.corpus);
  const double t0 = now_us();
  const data::EncodedText enc = data::encode_documents(*t, text, false);
  const double t1 = now_us();
  const std::string back = t->decode(enc.ids);
  const double t2 = now_us();
  size_t first = 0;
  while (first < std::min(back.size(), text.size()) && back[first] == text[first]) ++first;
  const bool same = back == text;
  std::printf("tokenizer %s on %s: %zu bytes, %zu documents -> %zu tokens (%.2f bytes per "
              "token; encode %.1f s, decode %.1f s); round trip: %s\n",
              t->describe().c_str(), f.corpus.c_str(), text.size(), enc.doc_starts.size(),
              enc.ids.size(),
              static_cast<double>(text.size()) /
                  static_cast<double>(std::max<size_t>(1, enc.ids.size())),
              (t1 - t0) / 1e6, (t2 - t1) / 1e6,
              same ? "identical" : fmt::format("differs from byte {}", first).c_str());
  return same ? 0 : 1;
}

struct PrepareFlags {
  std::string tokenizer, corpus = "kjv", out;
};

int run_prepare_data(const PrepareFlags& f) {
  if (world_rank() != 0) return 0;
  PARM_CONFIG_CHECK(!f.tokenizer.empty(), "parm prepare-data needs --tokenizer byte|FILE.model");
  PARM_CONFIG_CHECK(!f.out.empty(), "parm prepare-data needs --out DIR");
  const auto t = data::load_tokenizer(f.tokenizer);
  const double t0 = now_us();
  const data::PrepareSummary s = data::prepare_dataset(*t, f.corpus, f.out);
  std::printf("prepared %s: %s tokenized with %s: %lld bytes, %lld documents -> %lld tokens "
              "(%.1f s)\n",
              f.out.c_str(), f.corpus.c_str(), t->describe().c_str(),
              static_cast<long long>(s.text_bytes), static_cast<long long>(s.documents),
              static_cast<long long>(s.tokens), (now_us() - t0) / 1e6);
  if (s.not_round_trip == 0) {
    std::printf("round trip: all %lld documents decode to their text\n",
                static_cast<long long>(s.documents));
  } else {
    std::printf("warning: %lld of %lld documents do not decode to their text (SentencePiece "
                "decodes U+2581 as a space; invalid UTF-8 is replaced)\n",
                static_cast<long long>(s.not_round_trip), static_cast<long long>(s.documents));
  }
  return 0;
}

}  // namespace

Command add_tokenizer(CLI::App& root) {
  auto* app = root.add_subcommand("tokenizer", "train or check a tokenizer");
  app->require_subcommand(1);
  auto f = std::make_shared<TokenizerFlags>();
  auto* train = app->add_subcommand("train", "train a SentencePiece tokenizer on a corpus");
  train->add_option("--corpus", f->corpus, "kjv or file:PATH (one document per line)");
  train->add_option("--vocab", f->vocab,
                    "vocabulary size (<unk>, the 256 byte pieces and the learnt pieces)");
  train->add_option("--type", f->type, "bpe (default) or unigram");
  train->add_option("--threads", f->threads, "the trainer's threads (default 1)");
  train->add_option("--out", f->out, "the .model file to write")->required();
  auto* check = app->add_subcommand(
      "check", "decode(encode(text)) == text over a whole corpus, with its token count");
  check->add_option("--tokenizer", f->tokenizer, "byte or a .model file")->required();
  check->add_option("--corpus", f->corpus, "kjv or file:PATH");
  return {app, [f, train, check]() -> int {
            if (train->parsed()) return run_tokenizer_train(*f);
            if (check->parsed()) return run_tokenizer_check(*f);
            return 2;
          }};
}

Command add_prepare_data(CLI::App& root) {
  auto* app = root.add_subcommand(
      "prepare-data", "tokenize a corpus once into a prepared dataset folder (parm train --data)");
  auto f = std::make_shared<PrepareFlags>();
  app->add_option("--tokenizer", f->tokenizer, "byte or a .model file")->required();
  app->add_option("--corpus", f->corpus, "kjv or file:PATH (one document per line)");
  app->add_option("--out", f->out, "the dataset folder to write (must not exist)")->required();
  return {app, [f] { return run_prepare_data(*f); }};
}

}  // namespace parm::cli
