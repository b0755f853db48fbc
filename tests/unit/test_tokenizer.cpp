// The tokenizer interface (data/tokenizer.h): the byte tokenizer's ids, round trip, records.
#include <gtest/gtest.h>

#include "data/checksum.h"
#include "data/tokenizer.h"
#include "parm/error.h"

namespace parm::data {
namespace {

TEST(Tokenizer, ByteIdsAreTheBytes) {
  auto t = load_tokenizer("byte");
  EXPECT_EQ(t->kind(), "byte");
  EXPECT_EQ(t->vocab_size(), 256);
  const std::string text = std::string("In the beginning\n\xff\x00", 19);
  const auto ids = t->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 'I');
  EXPECT_EQ(ids[16], '\n');
  EXPECT_EQ(ids[17], 255);
  EXPECT_EQ(ids[18], 0);
  EXPECT_EQ(t->decode(ids), text);
}

TEST(Tokenizer, ByteDecodeRefusesIdsOutsideTheVocabulary) {
  auto t = byte_tokenizer();
  const std::vector<int32_t> bad = {65, 256};
  EXPECT_THROW(t->decode(bad), InvalidConfig);
  const std::vector<int32_t> neg = {-1};
  EXPECT_THROW(t->decode(neg), InvalidConfig);
}

TEST(Tokenizer, RecordsNameTheTokenizer) {
  auto t = byte_tokenizer();
  EXPECT_EQ(t->record(), (nlohmann::json{{"kind", "byte"}, {"vocab", 256}}));
  EXPECT_EQ(t->checksum(), "");
  auto back = tokenizer_from_record(t->record(), "/nonexistent", "test");
  EXPECT_EQ(back->identity(), t->identity());
  check_same_tokenizer(t->record(), "a", back->record("x.model"), "b");
  const nlohmann::json other = {{"kind", "sentencepiece"}, {"vocab", 8192}, {"fnv1a64", "00"}};
  try {
    check_same_tokenizer(t->record(), "the dataset d", other, "checkpoint c");
    FAIL() << "a different tokenizer was accepted";
  } catch (const InvalidConfig& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the dataset d"), std::string::npos) << m;
    EXPECT_NE(m.find("checkpoint c"), std::string::npos) << m;
    EXPECT_NE(m.find("8192"), std::string::npos) << m;
  }
  EXPECT_THROW(tokenizer_from_record(nlohmann::json{{"vocab", 3}}, ".", "test"), InvalidConfig);
  EXPECT_THROW(load_tokenizer("no-such-kind"), InvalidConfig);
}

TEST(Tokenizer, Fnv1a64StreamsAsOneBuffer) {
  const std::string s = "hello world";
  Fnv1a64 h;
  h.update(s.data(), 5);
  h.update(s.data() + 5, s.size() - 5);
  EXPECT_EQ(h.value(), fnv1a64(s.data(), s.size()));
  EXPECT_EQ(fnv1a64("", 0), 1469598103934665603ull);  // the basis checkpoints always used
  EXPECT_EQ(hex64(0xab), "00000000000000ab");
}

}  // namespace
}  // namespace parm::data
