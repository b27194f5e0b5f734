#pragma once
// "Did you mean": the closest of a list of names to a misspelt one, for the messages of job-file
// validation, the registry and the command line.
#include <cstddef>
#include <string>
#include <vector>

namespace trainrun::core {

/// `s` with ASCII letters in lower case (case-insensitive comparisons of names and units).
std::string to_lower(std::string s);
/// Levenshtein distance (insertions, deletions and substitutions, each 1).
size_t edit_distance(const std::string& a, const std::string& b);
/// The candidate closest to `word` (case-insensitive) within a distance of max(2, length / 3),
/// or "" when none is that close.
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace trainrun::core
