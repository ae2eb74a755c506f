#include "mcp/schema.h"

#include <regex>

namespace airlock::mcp {

using nlohmann::json;

namespace {

bool has_type(const json& value, const std::string& type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "integer") {
    if (value.is_number_integer()) return true;
    // 3.0 is an integer to JSON Schema (and to JavaScript clients).
    return value.is_number_float() &&
           value.get<double>() == static_cast<double>(static_cast<int64_t>(value.get<double>()));
  }
  if (type == "number") return value.is_number();
  return true;  // unknown type names constrain nothing
}

std::string type_words(const json& type) {
  if (type.is_string())
    return type.get<std::string>() == "integer"  ? "an integer"
           : type.get<std::string>() == "object" ? "an object"
           : type.get<std::string>() == "array"  ? "an array"
                                                 : "a " + type.get<std::string>();
  std::string out;
  for (size_t i = 0; i < type.size(); ++i) out += (i ? " or " : "") + type_words(type[i]);
  return out;
}

std::string name_of(const std::string& field) { return field.empty() ? "arguments" : field; }

std::string child(const std::string& field, const std::string& key) {
  return field.empty() ? key : field + "." + key;
}

}  // namespace

std::optional<SchemaViolation> check_schema(const json& schema, const json& value,
                                            const std::string& field) {
  if (!schema.is_object()) return std::nullopt;
  auto bad = [&](const std::string& message) {
    return SchemaViolation{field, name_of(field) + " " + message};
  };
  if (auto t = schema.find("type"); t != schema.end()) {
    bool ok = false;
    if (t->is_string()) ok = has_type(value, *t);
    if (t->is_array())
      for (const auto& one : *t) ok = ok || has_type(value, one);
    if (!ok) return bad("must be " + type_words(*t));
  }
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
    bool ok = false;
    std::string choices;
    for (const auto& v : *e) {
      ok = ok || v == value;
      choices += (choices.empty() ? "" : ", ") + v.dump();
    }
    if (!ok) return bad("must be one of " + choices);
  }
  if (value.is_number()) {
    double v = value.get<double>();
    if (auto m = schema.find("minimum"); m != schema.end() && v < m->get<double>())
      return bad("must be at least " + m->dump());
    if (auto m = schema.find("maximum"); m != schema.end() && v > m->get<double>())
      return bad("must be at most " + m->dump());
  }
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    if (auto m = schema.find("minLength"); m != schema.end() && s.size() < m->get<size_t>())
      return bad(m->get<size_t>() == 1 ? "must not be empty"
                                       : "must have at least " + m->dump() + " characters");
    if (auto m = schema.find("maxLength"); m != schema.end() && s.size() > m->get<size_t>())
      return bad("must have at most " + m->dump() + " characters");
    if (auto p = schema.find("pattern"); p != schema.end() && p->is_string())
      if (!std::regex_search(s, std::regex(p->get<std::string>(), std::regex::ECMAScript)))
        return bad("must match " + p->get<std::string>());
  }
  if (value.is_array()) {
    if (auto m = schema.find("minItems"); m != schema.end() && value.size() < m->get<size_t>())
      return bad(m->get<size_t>() == 1 ? "must not be empty"
                                       : "must have at least " + m->dump() + " items");
    if (auto m = schema.find("maxItems"); m != schema.end() && value.size() > m->get<size_t>())
      return bad("must have at most " + m->dump() + " items");
    if (auto items = schema.find("items"); items != schema.end())
      for (size_t i = 0; i < value.size(); ++i)
        if (auto v = check_schema(*items, value[i], name_of(field) + "[" + std::to_string(i) + "]"))
          return v;
  }
  if (value.is_object()) {
    static const json kNoProperties = json::object();
    const json& props = schema.contains("properties") ? schema["properties"] : kNoProperties;
    if (auto r = schema.find("required"); r != schema.end() && r->is_array())
      for (const auto& key : *r)
        if (!value.contains(key.get<std::string>()))
          return SchemaViolation{child(field, key), child(field, key) + " is required"};
    for (const auto& [key, v] : value.items()) {
      if (props.contains(key)) {
        if (auto bad_child = check_schema(props[key], v, child(field, key))) return bad_child;
        continue;
      }
      auto extra = schema.find("additionalProperties");
      if (extra == schema.end()) continue;
      if (extra->is_boolean() && !extra->get<bool>()) {
        std::string known;
        for (const auto& [k, _] : props.items()) known += (known.empty() ? "" : ", ") + k;
        return SchemaViolation{child(field, key),
                               "unknown field " + child(field, key) +
                                   (known.empty() ? "" : " (known: " + known + ")")};
      }
      if (auto bad_child = check_schema(*extra, v, child(field, key))) return bad_child;
    }
  }
  return std::nullopt;
}

}  // namespace airlock::mcp
