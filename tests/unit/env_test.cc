#include <map>
#include <string>

#include <gtest/gtest.h>

#include "common/env.h"

namespace ncclext {
namespace {

Env parseFrom(const std::map<std::string, std::string>& vars, std::vector<std::string>* problems) {
  return parseEnv(
      [&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      problems);
}

TEST(Env, DefaultsWhenUnset) {
  std::vector<std::string> problems;
  Env e = parseFrom({}, &problems);
  EXPECT_EQ(e.logLevel, LogLevel::kWarn);
  EXPECT_DOUBLE_EQ(e.timeoutSeconds, 100.0);
  EXPECT_EQ(e.lsaDomainSize, 0);
  EXPECT_EQ(e.railOverlap, 0);
  EXPECT_TRUE(problems.empty());
}

TEST(Env, ParsesEveryVariable) {
  std::vector<std::string> problems;
  Env e = parseFrom({{"NCCL_EXT_LOG", "debug"},
                     {"NCCL_EXT_TIMEOUT_S", "2.5"},
                     {"NCCL_EXT_LSA_DOMAIN_SIZE", "1"},
                     {"NCCL_EXT_HT_HIERARCHICAL", "1"},
                     {"NCCL_EXT_RAIL_ROUND_TOKENS", "64"},
                     {"NCCL_EXT_RAIL_OVERLAP", "1"},
                     {"NCCL_EXT_M2N_NET_CHANNELS", "8"}},
                    &problems);
  EXPECT_EQ(e.logLevel, LogLevel::kDebug);
  EXPECT_DOUBLE_EQ(e.timeoutSeconds, 2.5);
  EXPECT_EQ(e.lsaDomainSize, 1);
  EXPECT_EQ(e.htHierarchical, 1);
  EXPECT_EQ(e.railRoundTokens, 64);
  EXPECT_EQ(e.railOverlap, 1);
  EXPECT_EQ(e.m2nNetChannels, 8);
  EXPECT_TRUE(problems.empty());
}

TEST(Env, BadValuesKeepDefaultsAndSaySo) {
  std::vector<std::string> problems;
  Env e = parseFrom(
      {{"NCCL_EXT_LOG", "LOUD"}, {"NCCL_EXT_TIMEOUT_S", "-1"}, {"NCCL_EXT_LSA_DOMAIN_SIZE", "two"}}, &problems);
  EXPECT_EQ(e.logLevel, LogLevel::kWarn);
  EXPECT_DOUBLE_EQ(e.timeoutSeconds, 100.0);
  EXPECT_EQ(e.lsaDomainSize, 0);
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_NE(problems[0].find("NCCL_EXT_LOG=LOUD"), std::string::npos);
  EXPECT_NE(problems[1].find("NCCL_EXT_TIMEOUT_S=-1"), std::string::npos);
  EXPECT_NE(problems[2].find("NCCL_EXT_LSA_DOMAIN_SIZE=two"), std::string::npos);
}

TEST(Env, RejectsTrailingGarbageAndNonFinite) {
  std::vector<std::string> problems;
  Env e = parseFrom({{"NCCL_EXT_TIMEOUT_S", "5s"},
                     {"NCCL_EXT_LSA_DOMAIN_SIZE", "4x"},
                     {"NCCL_EXT_HT_HIERARCHICAL", "2"},
                     {"NCCL_EXT_RAIL_ROUND_TOKENS", "-3"},
                     {"NCCL_EXT_RAIL_OVERLAP", "yes"},
                     {"NCCL_EXT_M2N_NET_CHANNELS", "65"}},
                    &problems);
  EXPECT_DOUBLE_EQ(e.timeoutSeconds, 100.0);
  EXPECT_EQ(e.lsaDomainSize, 0);
  EXPECT_EQ(e.htHierarchical, 0);
  EXPECT_EQ(e.railRoundTokens, 0);
  EXPECT_EQ(e.railOverlap, 0);
  EXPECT_EQ(e.m2nNetChannels, 0);
  EXPECT_EQ(problems.size(), 6u);
  problems.clear();
  e = parseFrom({{"NCCL_EXT_TIMEOUT_S", "inf"}}, &problems);
  EXPECT_DOUBLE_EQ(e.timeoutSeconds, 100.0);
  EXPECT_EQ(problems.size(), 1u);
}

TEST(Env, DescribeNamesEveryVariable) {
  std::string d = describeEnv(Env{});
  EXPECT_NE(d.find("NCCL_EXT_LOG=WARN"), std::string::npos);
  EXPECT_NE(d.find("NCCL_EXT_TIMEOUT_S=100"), std::string::npos);
  EXPECT_NE(d.find("NCCL_EXT_LSA_DOMAIN_SIZE=0"), std::string::npos);
  EXPECT_NE(d.find("NCCL_EXT_HT_HIERARCHICAL=0"), std::string::npos);
  EXPECT_NE(d.find("NCCL_EXT_RAIL_ROUND_TOKENS=0"), std::string::npos);
  EXPECT_NE(d.find("NCCL_EXT_RAIL_OVERLAP=0"), std::string::npos);
  EXPECT_NE(d.find("NCCL_EXT_M2N_NET_CHANNELS=0"), std::string::npos);
}

}  // namespace
}  // namespace ncclext
