#include <ditrl/precision/names.hpp>

namespace ditrl::precision {

namespace {

bool match_class(const std::string& pattern, size_t& p, char c) {
  // pattern[p] == '['; on return p is past the closing ']'.
  size_t i = p + 1;
  const bool negate = i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^');
  if (negate) ++i;
  bool matched = false;
  bool first = true;
  for (; i < pattern.size() && (first || pattern[i] != ']'); ++i, first = false) {
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
      matched |= pattern[i] <= c && c <= pattern[i + 2];
      i += 2;
    } else {
      matched |= pattern[i] == c;
    }
  }
  p = i + 1;
  return matched != negate;
}

bool glob_from(const std::string& pattern, size_t p, const std::string& name, size_t n) {
  while (p < pattern.size()) {
    const char pc = pattern[p];
    if (pc == '*') {
      while (p < pattern.size() && pattern[p] == '*') ++p;
      if (p == pattern.size()) return true;
      for (size_t k = n; k <= name.size(); ++k)
        if (glob_from(pattern, p, name, k)) return true;
      return false;
    }
    if (n == name.size()) return false;
    if (pc == '?') {
      ++p, ++n;
    } else if (pc == '[' && pattern.find(']', p + 2) != std::string::npos) {
      if (!match_class(pattern, p, name[n])) return false;
      ++n;
    } else {
      if (pc != name[n]) return false;
      ++p, ++n;
    }
  }
  return n == name.size();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void replace_once(std::string& s, const std::string& from, const std::string& to) {
  if (size_t at = s.find(from); at != std::string::npos) s.replace(at, from.size(), to);
}

}  // namespace

bool glob_match(const std::string& pattern, const std::string& name) { return glob_from(pattern, 0, name, 0); }

std::string canonical_name(const std::string& name) {
  std::string out = name;
  const std::string prefix = "base_model.model.";
  if (out.rfind(prefix, 0) == 0) out.erase(0, prefix.size());
  replace_once(out, ".base_layer.", ".");
  replace_once(out, ".lora_A.default.", ".lora_A.");
  replace_once(out, ".lora_B.default.", ".lora_B.");
  return out;
}

std::string peft_name(const std::string& canonical, bool wrapped) {
  std::string out = canonical;
  if (is_lora_name(out)) {
    replace_once(out, ".lora_A.", ".lora_A.default.");
    replace_once(out, ".lora_B.", ".lora_B.default.");
  } else if (wrapped) {
    const size_t dot = out.rfind('.');
    out = out.substr(0, dot) + ".base_layer" + out.substr(dot);
  }
  return "base_model.model." + out;
}

bool is_lora_name(const std::string& canonical) {
  return ends_with(canonical, ".lora_A.weight") || ends_with(canonical, ".lora_B.weight");
}

std::string lora_base_name(const std::string& canonical) {
  if (!is_lora_name(canonical)) return canonical;
  return canonical.substr(0, canonical.size() - std::string(".lora_A.weight").size()) + ".weight";
}

}  // namespace ditrl::precision
