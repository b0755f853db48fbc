// The cost profile's device kind (issue 16): written and read back, absent in older profiles
// (the CPU), refused when malformed, and a profile of another device kind refused for a run
// (--schedule auto) with both devices named.
#include <gtest/gtest.h>

#include <string>

#include "parm/error.h"
#include "perfmodel/profile.h"

namespace parm::perfmodel {
namespace {

Profile valid_profile() {
  Profile p;
  for (auto& link : p.comm)
    for (auto& f : link) {
      f.alpha_us = 1.0;
      f.beta_us_per_byte = 1e-4;
      f.r2 = 0.99;
      f.samples = 4;
      f.group_sizes = {2};
      f.source = "measured";
    }
  for (auto& g : p.gemm) g = GemmFit{1.0, 10.0, 0.9, 4, "measured"};
  for (auto& m : p.mem) m = MemFit{1.0, 10.0, 0.9, 4, "measured"};
  return p;
}

std::string refusal(const nlohmann::json& j) {
  try {
    profile_from_json(j, "p.json");
  } catch (const InvalidConfig& e) {
    return e.what();
  }
  return "";
}

TEST(ProfileDevice, RoundTripsAndDefaultsToTheCpu) {
  Profile p = valid_profile();
  p.device = Device::kCuda;
  nlohmann::json j = profile_to_json(p);
  EXPECT_EQ(j.at("device"), "cuda");
  EXPECT_EQ(profile_from_json(j, "p.json").device, Device::kCuda);
  j.erase("device");  // a profile written before the key existed: taken on the CPU
  EXPECT_EQ(profile_from_json(j, "p.json").device, Device::kCpu);
}

TEST(ProfileDevice, RefusesAnUnknownDevice) {
  nlohmann::json j = profile_to_json(valid_profile());
  for (const nlohmann::json& bad : {nlohmann::json("gpu"), nlohmann::json(1)}) {
    j["device"] = bad;
    const std::string msg = refusal(j);
    EXPECT_NE(msg.find("'device' is " + bad.dump()), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"cpu\" or \"cuda\""), std::string::npos) << msg;
  }
}

TEST(ProfileDevice, ARunRefusesAProfileOfAnotherDeviceKind) {
  Profile p = valid_profile();
  p.device = Device::kCpu;
  EXPECT_NO_THROW(check_profile_device(p, Device::kCpu, "cpu.json"));
  try {
    check_profile_device(p, Device::kCuda, "cpu.json");
    FAIL() << "a CPU profile priced a cuda run";
  } catch (const InvalidConfig& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cpu.json was taken on device cpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("computes on device cuda"), std::string::npos) << msg;
    EXPECT_NE(msg.find("calibrate --device cuda"), std::string::npos) << msg;
  }
  p.device = Device::kCuda;
  EXPECT_NO_THROW(check_profile_device(p, Device::kCuda, "gpu.json"));
  EXPECT_THROW(check_profile_device(p, Device::kCpu, "gpu.json"), InvalidConfig);
}

}  // namespace
}  // namespace parm::perfmodel
