#include "perfmodel/json_reader.h"

#include "parm/fileio.h"

namespace parm::perfmodel {

nlohmann::json read_json_file(const std::string& what, const std::string& path) {
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    throw InvalidConfig(fmt::format("{} {} cannot be read: {}", what, path, e.what()));
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InvalidConfig(fmt::format("{} {} is not valid JSON: {}", what, path, e.what()));
  }
}

}  // namespace parm::perfmodel
