// py_json: byte-for-byte Python `json.dumps(v, ensure_ascii=False)`. Expected
// strings were produced with CPython 3.11.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "chat/py_json.h"

using namespace dsv4;
using ordered_json = nlohmann::ordered_json;

TEST(PyJson, FloatReprMatchesPython) {
  const std::pair<double, const char*> cases[] = {
      {1.0, "1.0"},
      {0.1, "0.1"},
      {1e-05, "1e-05"},
      {1e+20, "1e+20"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {0.0001, "0.0001"},
      {123456789012345678.0, "1.2345678901234568e+17"},
      {1.5, "1.5"},
      {2.5e-07, "2.5e-07"},
      {-0.0, "-0.0"},
      {0.0, "0.0"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {100.0, "100.0"},
      {1e22, "1e+22"},
      {3.14159, "3.14159"},
      {-2.5, "-2.5"},
      {1234567890123456.7, "1234567890123456.8"},
      {0.30000000000000004, "0.30000000000000004"},
      {12345.678, "12345.678"},
      {std::numeric_limits<double>::infinity(), "Infinity"},
      {-std::numeric_limits<double>::infinity(), "-Infinity"},
      {std::nan(""), "NaN"},
  };
  for (const auto& [v, want] : cases) EXPECT_EQ(py_float_repr(v), want) << want;
}

TEST(PyJson, NestedValuesUsePythonSeparatorsAndKeyOrder) {
  auto v = ordered_json::parse(R"({"z": [1, 2, {"b": null, "c": true, "d": false}], "a": {}, "f": [], "n": -3})");
  EXPECT_EQ(py_json_dumps(v), R"({"z": [1, 2, {"b": null, "c": true, "d": false}], "a": {}, "f": [], "n": -3})");
  EXPECT_EQ(py_json_dumps(ordered_json::parse(R"({"a":1.0,"b":2,"c":1e2,"d":-0,"e":[[],{}]})")),
            R"({"a": 1.0, "b": 2, "c": 100.0, "d": 0, "e": [[], {}]})");
  EXPECT_EQ(py_json_dumps(ordered_json::parse("-9223372036854775808")), "-9223372036854775808");
  EXPECT_EQ(py_json_dumps(ordered_json::parse("18446744073709551615")), "18446744073709551615");
  EXPECT_EQ(py_json_dumps(ordered_json::parse("[1.5e-7, 2.5]")), "[1.5e-07, 2.5]");
}

TEST(PyJson, StringEscapes) {
  // Python: json.dumps('x"y\\z\n\t\r\b\f\x00\x01\x1f\x7f é 😀 \u2028', ensure_ascii=False)
  const std::string s =
      std::string("x\"y\\z\n\t\r\b\f") + std::string("\0\x01\x1f\x7f", 4) + " \xc3\xa9 \xf0\x9f\x98\x80 \xe2\x80\xa8";
  EXPECT_EQ(py_json_quote(s), std::string("\"x\\\"y\\\\z\\n\\t\\r\\b\\f\\u0000\\u0001\\u001f\x7f") +
                                  " \xc3\xa9 \xf0\x9f\x98\x80 \xe2\x80\xa8\"");
  EXPECT_EQ(py_json_dumps(ordered_json(s)), py_json_quote(s));
  EXPECT_EQ(py_json_quote(""), "\"\"");
  EXPECT_EQ(py_json_quote("<｜DSML｜parameter>"), "\"<｜DSML｜parameter>\"");
  // Escaping is byte-wise: pieces concatenate to the whole.
  std::string a, b;
  py_json_escape_to(a, s);
  for (char c : s) py_json_escape_to(b, std::string_view(&c, 1));
  EXPECT_EQ(a, b);
}

TEST(PyJson, ObjectKeysAreEscaped) {
  ordered_json v = ordered_json::object();
  v["q\"k"] = "v\n";
  v["\x01"] = ordered_json::array({true, nullptr});
  EXPECT_EQ(py_json_dumps(v), "{\"q\\\"k\": \"v\\n\", \"\\u0001\": [true, null]}");
}

TEST(PyJson, ToolSchemaLikeTheOfficialEncoder) {
  auto fn = ordered_json::parse(R"({"name": "get_weather", "description": "Get the weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}})");
  EXPECT_EQ(py_json_dumps(fn),
            R"({"name": "get_weather", "description": "Get the weather for a city", "parameters": {"type": "object", )"
            R"("properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", )"
            R"("enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}})");
}
