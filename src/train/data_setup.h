// What a run trains on, from the config's data section (train_config.h's DataConfig):
//
//   data.tokenizer   data.prepared   the run reads
//   byte / absent    absent          the corpus's bytes, in memory (no files)
//   any              DIR             DIR (a tokenizer named as well must be DIR's)
//   FILE.model       absent          the corpus prepared with FILE, in the cache
//   {kind, vocab}    absent          a tokenizer of that kind and size trained on the corpus,
//                                    and the corpus prepared with it, both in the cache
//
// The cache (data.cache, --data-cache; default <the parm binary's folder>/data-cache) keeps
// one folder per (corpus text, tokenizer) (data/prepare.h): made once, by world rank 0, and
// reused by every later run.
#pragma once

#include <memory>

#include "data/corpus.h"
#include "data/tokenizer.h"
#include "parm/comm.h"
#include "train/train_config.h"

namespace parm::train {

struct TrainingData {
  data::Corpus corpus;
  std::shared_ptr<const data::Tokenizer> tokenizer;
};

// The vocabulary of the config's tokenizer, without building anything: 256 for bytes, the
// size named in {kind, vocab}, else read from the .model file or the dataset's dataset.json.
int32_t tokenizer_vocab(const DataConfig& d);
// model.vocab from the tokenizer (its vocabulary, +1 for BERT's [MASK]). Refuses a model.vocab
// written in the config that differs from it (a byte model may keep a larger one, as before).
void apply_tokenizer_vocab(TrainConfig& c);

// Collective over `world`: where the data is in the cache and missing, world rank 0 makes it
// (and says so when `verbose`); then every rank opens it, checks that the dataset's tokenizer
// is the one named, and maps it. InvalidConfig alike on every rank when anything is wrong.
TrainingData open_training_data(const TrainConfig& c, Communicator& world, bool verbose);

}  // namespace parm::train
