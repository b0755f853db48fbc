// A checkpoint's on-disk form, and everything about it that one process checks alone: every
// manifest field against the others, against the model and against the files on disk, before
// a byte of tensor data is read. No MPI: the loader (checkpoint.h) runs it on world rank 0,
// the fuzz test (tests/fuzz) in one process.
//
// <folder>/manifest.json
//   {"format": "parm-checkpoint", "version": 1, "step": S, "optimizer_steps": O <= S,
//    "data_position": D, "model_config": {...},
//    "tokenizer": {"kind": "sentencepiece", "vocab": V, "fnv1a64": "..", "file": "tokenizer.model"}
//                 (data/tokenizer.h's record; absent: the byte tokenizer),
//    "saved_from_layout": {"world": W, "mp": .., "ep": .., "esp": ..},   (informative)
//    "tensors": [{"name": "blocks.0.attn.qkv.weight", "kind": "param" | "adam_m" | "adam_v",
//                 "file": "tensors/0000.param.bin", "shape": [..], "dtype": "float32",
//                 "bytes": numel * 4, "fnv1a64": "<16 lower-case hex digits>"}, ...]}
// <folder>/tokenizer.model: the tokenizer's model file, where it has one.
// <folder>/tensors/*.bin: each whole (unsharded) tensor, row-major float32 in host byte order.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parm/tensor.h"

namespace parm::train {

constexpr const char* kCheckpointFormat = "parm-checkpoint";
constexpr int kCheckpointVersion = 1;
constexpr const char* kCheckpointTokenizerFile = "tokenizer.model";

// One whole tensor that a model saves and expects back.
struct TensorSpec {
  std::string name;  // the parameter's name
  std::string kind;  // "param", "adam_m" or "adam_v"
  Shape shape;       // whole (unsharded)
  std::string file;  // relative to the checkpoint folder: where save_checkpoint writes it
};

// A tensor of a validated manifest. Invariant: bytes == numel(spec.shape) * 4 and `file` is
// a plain file name under tensors/ of exactly `bytes` bytes (when validated).
struct TensorRecord {
  TensorSpec spec;       // spec.file is the manifest's file
  uint64_t bytes = 0;
  std::string fnv1a64;   // 16 lower-case hex digits
};

struct Manifest {
  int64_t step = 0;             // optimizer steps done by the training loop
  int64_t optimizer_steps = 0;  // AdamW's step count (bias correction)
  int64_t data_position = 0;    // training sequences consumed
  nlohmann::json model_config;
  nlohmann::json router_bias;   // per MoE layer, E numbers (--router-bias-update); null: none
  nlohmann::json tokenizer;     // the tokenizer's record; null: none recorded (bytes)
  std::vector<TensorRecord> tensors;  // in the order of the specs validated against
};

// The FNV-1a 64-bit hash of `n` bytes, as 16 lower-case hex digits.
std::string fnv1a64_hex(const void* data, size_t n);

// The manifest entry of a whole tensor (`data`: numel(spec.shape) floats).
nlohmann::json tensor_entry(const TensorSpec& spec, const float* data);
// The whole manifest; `tensors` holds tensor_entry()s, `saved_from_layout` is informative.
nlohmann::json manifest_json(const Manifest& header, const nlohmann::json& saved_from_layout,
                             nlohmann::json tensors);

// Size of a file named relative to the checkpoint folder; nullopt when it is missing or not
// a regular file.
using FileSizeFn = std::function<std::optional<uint64_t>(const std::string& relative)>;
FileSizeFn file_sizes_in(const std::string& folder);

// `path` is a checkpoint folder (it holds manifest.json) or a save dir whose `latest` file
// names one of its checkpoint folders. Throws InvalidConfig when it is neither.
std::string resolve_checkpoint_folder(const std::string& path);
// folder/manifest.json parsed; InvalidConfig when it is unreadable, oversized or not JSON.
nlohmann::json read_manifest_json(const std::string& folder);

// Checks every field of `manifest` (format, version, the counters, the tokenizer against
// `tokenizer` (an identity, data/tokenizer.h; null: bytes), the model config against
// `model_config`, and per tensor: name, kind, duplicates, shape against `expected`, dtype,
// bytes == numel * 4, a file name that stays under tensors/, that file's size from
// `size_of`, the checksum's form) and that `expected` and the manifest hold the same
// tensors. Pure apart from `size_of`. Throws InvalidConfig naming the folder's
// manifest.json, the tensor and the field. Returns the tensors in the order of `expected`.
Manifest validate_manifest(const nlohmann::json& manifest, const std::string& folder,
                           const std::vector<TensorSpec>& expected,
                           const nlohmann::json& model_config, const FileSizeFn& size_of,
                           const nlohmann::json& tokenizer = nullptr);

// Reads a validated tensor's file into `whole` (shape t.spec.shape), checking its size and
// checksum again. Throws InvalidConfig naming the file and the tensor.
void read_tensor_file(const std::string& folder, const TensorRecord& t, Tensor& whole);

}  // namespace parm::train
