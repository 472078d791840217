#include "apps/chorus/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace chorus::apps {

void Flags::String(const std::string& n, std::string def, std::string help) {
  flags_[n] = {Kind::kString, std::move(def), std::move(help), {}};
  order_.push_back(n);
}
void Flags::Int(const std::string& n, int64_t def, std::string help) {
  flags_[n] = {Kind::kInt, std::to_string(def), std::move(help), {}};
  order_.push_back(n);
}
void Flags::Float(const std::string& n, double def, std::string help) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", def);
  flags_[n] = {Kind::kFloat, buf, std::move(help), {}};
  order_.push_back(n);
}
void Flags::Bool(const std::string& n, std::string help) {
  flags_[n] = {Kind::kBool, "false", std::move(help), {}};
  order_.push_back(n);
}
void Flags::Repeated(const std::string& n, std::string help) {
  flags_[n] = {Kind::kRepeated, "", std::move(help), {}};
  order_.push_back(n);
}

Status Flags::Parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(Help().c_str(), stdout);
      return CancelledError("help");
    }
    if (a.rfind("--", 0) != 0)
      return InvalidArgumentError("unexpected argument '" + a.substr(0, 64) + "' (see --help)");
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end())
      return InvalidArgumentError("unknown flag --" + name.substr(0, 64) + " for '" + command_ +
                                  "' (see --help)");
    Flag& f = it->second;
    if (f.kind == Kind::kBool) {
      if (has_value && value != "true" && value != "false" && value != "1" && value != "0")
        return InvalidArgumentError("--" + name + " takes no value or true/false");
      f.values = {has_value ? ((value == "true" || value == "1") ? "true" : "false") : "true"};
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) return InvalidArgumentError("--" + name + " needs a value");
      value = argv[++i];
    }
    if (f.kind == Kind::kInt) {
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno == ERANGE)
        return InvalidArgumentError("--" + name + " expects an integer, got '" +
                                    value.substr(0, 32) + "'");
      (void)v;
    } else if (f.kind == Kind::kFloat) {
      char* end = nullptr;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !std::isfinite(v))
        return InvalidArgumentError("--" + name + " expects a number, got '" + value.substr(0, 32) +
                                    "'");
    }
    if (f.kind == Kind::kRepeated)
      f.values.push_back(value);
    else
      f.values = {value};
  }
  return OkStatus();
}

std::string Flags::GetString(const std::string& n) const {
  const Flag& f = flags_.at(n);
  return f.values.empty() ? f.def : f.values.back();
}
int64_t Flags::GetInt(const std::string& n) const {
  return std::strtoll(GetString(n).c_str(), nullptr, 10);
}
double Flags::GetFloat(const std::string& n) const {
  return std::strtod(GetString(n).c_str(), nullptr);
}
bool Flags::GetBool(const std::string& n) const { return GetString(n) == "true"; }
bool Flags::IsSet(const std::string& n) const { return !flags_.at(n).values.empty(); }
std::vector<std::string> Flags::GetRepeated(const std::string& n) const {
  return flags_.at(n).values;
}

std::string Flags::Help() const {
  std::string s = "usage: chorus " + command_ + " [flags]\n\n" + summary_ + "\n\nflags:\n";
  for (const auto& n : order_) {
    const Flag& f = flags_.at(n);
    std::string left = "  --" + n;
    if (f.kind != Kind::kBool)
      left += f.kind == Kind::kInt ? " N" : f.kind == Kind::kFloat ? " X" : " VALUE";
    if (left.size() < 28)
      left.resize(28, ' ');
    else
      left += "\n" + std::string(28, ' ');
    s += left + f.help;
    if (f.kind != Kind::kBool && f.kind != Kind::kRepeated && !f.def.empty())
      s += " (default: " + f.def + ")";
    if (f.kind == Kind::kRepeated) s += " (repeatable)";
    s += "\n";
  }
  s += "  --help                    show this help\n";
  return s;
}

}  // namespace chorus::apps
