// Deterministic mutations of JSON documents and files for the readers' fuzz tests: each test
// starts from valid input, applies a few of these, and requires the reader to either accept
// a valid result or refuse with parm::InvalidConfig (never another exception, a crash or an
// out-of-bounds access; CI runs these under AddressSanitizer and UBSan).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

#include <nlohmann/json.hpp>

#include "parm/error.h"

namespace parm::fuzz {

// splitmix64: the same sequence on every platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
  bool chance(int percent) { return below(100) < static_cast<size_t>(percent); }

 private:
  uint64_t s_;
};

// Values that break readers: wrong types, huge and negative numbers, edge integers.
inline nlohmann::json nasty_value(Rng& rng, const nlohmann::json& old) {
  switch (rng.below(22)) {
    case 0: return nullptr;
    case 1: return true;
    case 2: return 0;
    case 3: return -1;
    case 4: return std::numeric_limits<int64_t>::min();
    case 5: return std::numeric_limits<int64_t>::max();
    case 6: return std::numeric_limits<uint64_t>::max();
    case 7: return 1e300;
    case 8: return -1e300;
    case 9: return 0.5;
    case 10: return "";
    case 11: return std::string(1000, 'x');
    case 12: return nlohmann::json::array();
    case 13: return nlohmann::json::object();
    case 14: return nlohmann::json::array({1, 2, 3});
    case 15: return {{"a", 1}};
    case 16: return static_cast<int64_t>(rng.below(2001)) - 1000;
    case 17: return "../../etc/passwd";
    case 18: return 2147483648ll;  // INT_MAX + 1
    default:
      if (old.is_number_integer() && !old.is_number_unsigned()) {
        // Near the old value, saturating at int64's ends (a value already there stays).
        const int64_t v = old.get<int64_t>(), d = static_cast<int64_t>(rng.below(5)) - 2;
        if ((d > 0 && v > std::numeric_limits<int64_t>::max() - d) ||
            (d < 0 && v < std::numeric_limits<int64_t>::min() - d))
          return v;
        return v + d;
      }
      if (old.is_number_unsigned()) return old.get<uint64_t>() * (1 + rng.below(3)) + rng.below(3);
      if (old.is_number_float()) return old.get<double>() * -2.0;
      if (old.is_string()) return old.get<std::string>() + "x";
      return nullptr;
  }
}

// Every node of j as a JSON pointer ("" is the root).
inline void collect_pointers(const nlohmann::json& j, const nlohmann::json::json_pointer& at,
                             std::vector<nlohmann::json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object())
    for (const auto& [k, v] : j.items()) collect_pointers(v, at / k, out);
  else if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i) collect_pointers(j[i], at / i, out);
}

// One structural change to a random node of j: replace its value, delete it, duplicate it or
// a sibling, rename its key, or add an unknown key. Returns what it did.
inline std::string mutate_json(Rng& rng, nlohmann::json& j) {
  std::vector<nlohmann::json::json_pointer> nodes;
  collect_pointers(j, nlohmann::json::json_pointer(), nodes);
  const auto at = nodes[rng.below(nodes.size())];
  const std::string where = at.to_string();
  if (at.empty()) {
    j = nasty_value(rng, j);
    return "root replaced";
  }
  nlohmann::json& parent = j[at.parent_pointer()];
  const std::string key = at.back();
  switch (rng.below(6)) {
    case 0:
      if (parent.is_object()) parent.erase(key);
      else parent.erase(static_cast<size_t>(std::stoul(key)));
      return "deleted " + where;
    case 1:
      if (parent.is_array()) {
        parent.push_back(j[at]);
        return "duplicated " + where;
      }
      parent[key + "_extra"] = j[at];
      return "unknown key beside " + where;
    case 2:
      if (parent.is_object()) {
        nlohmann::json v = j[at];
        parent.erase(key);
        parent[key.empty() ? "x" : key.substr(0, key.size() - 1)] = v;
        return "renamed " + where;
      }
      [[fallthrough]];
    default: {
      nlohmann::json& v = j[at];
      v = nasty_value(rng, v);
      return "replaced " + where + " with " + v.dump().substr(0, 40);
    }
  }
}

// One byte-level change: bit flips, a truncation, inserted or deleted bytes, a repeated run.
inline std::string mutate_bytes(Rng& rng, std::string& s) {
  if (s.empty()) {
    s.push_back(static_cast<char>(rng.below(256)));
    return "byte added";
  }
  switch (rng.below(5)) {
    case 0: {
      const size_t flips = 1 + rng.below(4);
      for (size_t i = 0; i < flips; ++i)
        s[rng.below(s.size())] ^= static_cast<char>(1u << rng.below(8));
      return "bit flips";
    }
    case 1:
      s.resize(rng.below(s.size()));
      return "truncated to " + std::to_string(s.size());
    case 2:
      s.insert(rng.below(s.size() + 1), 1 + rng.below(8), static_cast<char>(rng.below(256)));
      return "bytes inserted";
    case 3: {
      const size_t at = rng.below(s.size());
      s.erase(at, 1 + rng.below(16));
      return "bytes deleted";
    }
    default: {
      const size_t at = rng.below(s.size());
      const size_t n = 1 + rng.below(std::min<size_t>(64, s.size() - at));
      s.insert(at, s.substr(at, n));
      return "run repeated";
    }
  }
}

// A fresh folder under the temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "parm-fuzz-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) != nullptr ? tmpl : std::string();
    if (path_.empty()) throw Error("cannot create a temporary folder");
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs `attempt` and classifies it: true when it succeeded, false when it refused with
// parm::InvalidConfig; any other exception fails the test with `what` (the mutation).
template <typename Fn>
bool accepted_or_refused(Fn&& attempt, const std::string& what, int& other_errors) {
  try {
    attempt();
    return true;
  } catch (const InvalidConfig&) {
    return false;
  } catch (const std::exception& e) {
    ++other_errors;
    ADD_FAILURE() << what << ": not refused with InvalidConfig but " << typeid(e).name()
                  << ": " << e.what();
    return false;
  }
}

// Prints how `cases` inputs fared and checks it: none failed otherwise than with
// InvalidConfig, most were refused (the mutations reach the checks) and some were accepted
// (harmless ones still load).
inline void expect_outcomes(const char* reader, int cases, int accepted, int refused,
                            int other) {
  std::printf("%s fuzz: %d cases, %d accepted, %d refused, %d other errors\n", reader, cases,
              accepted, refused, other);
  EXPECT_EQ(other, 0);
  EXPECT_GT(refused, cases / 2);
  EXPECT_GT(accepted, 0);
}

}  // namespace parm::fuzz
