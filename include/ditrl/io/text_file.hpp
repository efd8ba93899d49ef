#pragma once

// Whole small text files (JSON configs, indexes): read with an error naming
// the file, written under a temporary name and renamed, so a failed write
// never leaves a half-written file under the final name.

#include <string>

namespace ditrl::io {

std::string read_text_file(const std::string& path);
void write_text_file(const std::string& path, const std::string& text);

}  // namespace ditrl::io
