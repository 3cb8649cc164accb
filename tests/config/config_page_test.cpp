// docs/config.md's two key tables are the parser's: each row of the page is a key the
// parser reads, with its type and default (or its off value, and what stepwise does when it
// is on), and each key the parser reads has its row. Read from the page's source.
#include <stepwise/config.h>

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace stepwise {
namespace {

// The cells of each row of docs/config.md that `row` matches: the groups, [1] first.
std::vector<std::vector<std::string>> rows_of_page(const std::regex& row) {
  std::ifstream page(STEPWISE_SOURCE_DIR "/docs/config.md");
  EXPECT_TRUE(page.is_open()) << STEPWISE_SOURCE_DIR "/docs/config.md";
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(page, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, row)) continue;
    rows.emplace_back();
    for (size_t i = 1; i < m.size(); ++i) rows.back().push_back(m[i]);
  }
  return rows;
}

// `0.001` -> 0.001
std::string plain(std::string cell) {
  cell = std::regex_replace(cell, std::regex(R"(^\s+|\s+$)"), "");
  return cell.size() > 1 && cell.front() == '`' ? cell.substr(1, cell.size() - 2) : cell;
}

TEST(ConfigPage, KeyTableIsTheParsersTypesAndDefaults) {
  std::map<std::string, std::pair<std::string, std::string>> documented;
  const std::regex row(
      R"(^\| `([a-z0-9_.]+)` \| (integer|number|bool|string|object|\[number, number\]) \| ([^|]+) \|)");
  for (const auto& m : rows_of_page(row)) {
    documented[m[0]] = {plain(m[1]), plain(m[2])};
  }
  ASSERT_GT(documented.size(), 50u) << "the page's key table was not found";
  for (const auto& key : config_keys()) {
    const auto doc = documented.find(key.path);
    EXPECT_NE(doc, documented.end()) << "undocumented: " << key.path;
    if (doc == documented.end()) continue;
    EXPECT_EQ(doc->second.first, key.type) << key.path;
    EXPECT_EQ(doc->second.second, key.default_value) << key.path;
    documented.erase(doc);
  }
  for (const auto& [key, type_and_default] : documented) ADD_FAILURE() << "not a key: " << key;
}

TEST(ConfigPage, FeatureTableIsTheParsersOffValuesAndVerdicts) {
  std::map<std::string, std::vector<std::string>> documented;  // path -> off, on, why
  for (const auto& m : rows_of_page(
           std::regex(R"(^\| `([a-z0-9_.]+)` \| `?([^|`]+)`? \| (note|refused) \| ([^|]+) \|$)"))) {
    documented[m[0]] = {m[1], m[2], m[3]};
  }
  ASSERT_GT(documented.size(), 30u) << "the page's feature table was not found";
  for (const auto& key : deepspeed_feature_keys()) {
    const auto doc = documented.find(key.path);
    EXPECT_NE(doc, documented.end()) << "undocumented: " << key.path;
    if (doc == documented.end()) continue;
    EXPECT_EQ(doc->second, (std::vector<std::string>{key.off, key.when_on, key.why})) << key.path;
    documented.erase(doc);
  }
  for (const auto& [path, row] : documented) ADD_FAILURE() << "not read by the parser: " << path;
}

}  // namespace
}  // namespace stepwise
