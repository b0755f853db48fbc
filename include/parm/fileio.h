// Files that are never left half-written: write to a temporary file beside the target,
// flush, then rename over it.
#pragma once

#include <string>

namespace parm {

// Writes `content` to `path` atomically; throws parm::Error naming the path on failure.
void write_file_atomic(const std::string& path, const std::string& content);
// Whole file as a string; throws parm::Error naming the path when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace parm
