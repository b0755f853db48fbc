// A whole file mapped read-only into memory (POSIX mmap): the pages are read on first touch
// and shared by every process that maps the same file.
#pragma once

#include <cstdint>
#include <string>

namespace parm::data {

class MappedFile {
 public:
  // Throws parm::InvalidConfig naming `path` when it is missing, not a regular file or cannot
  // be mapped. An empty file maps to size() 0, data() nullptr.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace parm::data
