// Strict reading of the perfmodel's JSON files (profiles, cluster and grid files): every
// refusal is a parm::InvalidConfig naming the file and the key path.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parm/error.h"

namespace parm::perfmodel {

class JsonReader {
 public:
  // what: "cost profile", "cluster file", ...; origin: the path (or a name for in-memory JSON).
  JsonReader(std::string what, std::string origin)
      : what_(std::move(what)), origin_(std::move(origin)) {}

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  const nlohmann::json& at(const nlohmann::json& parent, const std::string& path,
                           const std::string& key) const {
    if (!parent.is_object() || !parent.contains(key)) fail("missing entry '{}'", join(path, key));
    return parent.at(key);
  }

  const nlohmann::json& object(const nlohmann::json& parent, const std::string& path,
                               const std::string& key) const {
    const auto& v = at(parent, path, key);
    if (!v.is_object()) fail("'{}' must be a JSON object, got {}", join(path, key), v.dump());
    return v;
  }

  const nlohmann::json& array(const nlohmann::json& parent, const std::string& path,
                              const std::string& key) const {
    const auto& v = at(parent, path, key);
    if (!v.is_array() || v.empty())
      fail("'{}' must be a non-empty JSON list, got {}", join(path, key), v.dump());
    return v;
  }

  // A number in [min, max] (min exclusive when !min_inclusive).
  double number_value(const nlohmann::json& v, const std::string& full, double min,
                      bool min_inclusive, double max = INFINITY) const {
    if (!v.is_number()) fail("'{}' must be a number, got {}", full, v.dump());
    const double d = v.get<double>();
    if (!std::isfinite(d)) fail("'{}' must be a finite number, got {}", full, v.dump());
    if (min_inclusive ? d < min : d <= min)
      fail("'{}' = {} is out of range: it must be {} {}", full, d, min_inclusive ? ">=" : ">",
           min);
    if (d > max) fail("'{}' = {} is out of range: it must be <= {}", full, d, max);
    return d;
  }
  double number(const nlohmann::json& parent, const std::string& path, const std::string& key,
                double min, bool min_inclusive, double max = INFINITY) const {
    return number_value(at(parent, path, key), join(path, key), min, min_inclusive, max);
  }

  // A whole number in [min, max] (1.0 and "1" are not whole numbers).
  int64_t integer_value(const nlohmann::json& v, const std::string& full, int64_t min,
                        int64_t max = INT64_MAX) const {
    if (!v.is_number_integer())
      fail("'{}' must be a whole number, got {}", full, v.dump());
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max))
      fail("'{}' = {} is out of range: it must be <= {}", full, v.dump(), max);
    const int64_t i = v.get<int64_t>();
    if (i < min || i > max)
      fail("'{}' = {} is out of range: it must be in [{}, {}]", full, i, min, max);
    return i;
  }
  int64_t integer(const nlohmann::json& parent, const std::string& path, const std::string& key,
                  int64_t min, int64_t max = INT64_MAX) const {
    return integer_value(at(parent, path, key), join(path, key), min, max);
  }

  std::string text(const nlohmann::json& parent, const std::string& path,
                   const std::string& key) const {
    const auto& v = at(parent, path, key);
    if (!v.is_string()) fail("'{}' must be a string, got {}", join(path, key), v.dump());
    return v.get<std::string>();
  }

  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    throw InvalidConfig(fmt::format("{} {}: {}", what_, origin_,
                                    fmt::format(f, std::forward<Args>(args)...)));
  }

 private:
  std::string what_, origin_;
};

// The JSON in the file at `path`; refuses an unreadable file or bad JSON, naming the path.
nlohmann::json read_json_file(const std::string& what, const std::string& path);

}  // namespace parm::perfmodel
