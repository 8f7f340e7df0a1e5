// Per-document text statistics from byte-level BPE token ids, in two passes over the ids.
//
// Implements, step for step, TokenTextStats.documents of megatron_gamma/data/token_stats.py
// (whose numpy form runs where the extension is not built; tests/test_data_token_stats.py checks
// both against the text):
//   token_cut_characters  finds each token whose last character is cut and finishes that
//                         character from the continuation bytes the next tokens start with
//                         (the caller classifies the characters: Han, Latin, visible);
//   token_document_stats  adds each token's table code (visible characters, Han characters,
//                         Latin words starting in it: three 21-bit fields of one int64) to its
//                         document's sum, with the cut characters as classified, fixes the
//                         first/last-Latin flags of the tokens a cut character spans, and
//                         subtracts a Latin word running on from the previous token of the same
//                         document.
// Single-threaded on purpose: preprocessing runs one per worker process, and forked workers
// must not start an OpenMP pool.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

namespace megatron_gamma {
namespace {

constexpr int64_t kField = 21;
constexpr int64_t kFieldMask = (int64_t{1} << kField) - 1;
constexpr int64_t kFirstLatin = 1, kLastLatin = 2, kCut = 4;
// Rows of the vocabulary table (token_stats.py, TokenTextStats.table): one column per token id,
// so that the pass over the ids reads the code and flags rows (2 x 8 bytes x V) from cache.
enum Row : int64_t {
  kCode,
  kFlags,
  kLeads,
  kPartial,
  kNeed,
  kOnlyPartial,
  kHeadCount,
  kHeadValue,
  kRows
};
// Bits of a cut character's class (token_stats.py).
constexpr int64_t kVisible = 1, kHan = 2, kLatin = 4;
// Statuses of token_cut_characters; token_stats.py raises the matching ValueError.
constexpr int64_t kOk = 0, kEndsInside = 1, kNotContinued = 2, kBadId = 3;

struct Vocab {
  const int64_t* table;
  int64_t size;
  int64_t operator()(Row row, int32_t id) const { return table[row * size + id]; }
  bool has(int32_t id) const { return id >= 0 && id < size; }
};

Vocab checked_vocab(const at::Tensor& ids, const at::Tensor& table) {
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kInt && ids.is_contiguous(),
              "token stats: ids must be contiguous 1-D int32");
  TORCH_CHECK(table.dim() == 2 && table.size(0) == kRows && table.scalar_type() == at::kLong &&
                  table.is_contiguous(),
              "token stats: table must be contiguous (8, V) int64");
  return {table.data_ptr<int64_t>(), table.size(1)};
}

// Steps through the continuation of the character cut at the end of token p: calls visit(j)
// for each token it takes bytes from; returns (the character's code point, status).
template <typename Visit>
std::pair<int64_t, int64_t> finish_cut(const int32_t* id, int64_t n, const Vocab& vocab,
                                       int64_t p, Visit visit) {
  int64_t value = vocab(kPartial, id[p]), need = vocab(kNeed, id[p]);
  for (int64_t j = p + 1; need > 0; ++j) {
    if (j >= n) return {value, kEndsInside};
    if (!vocab.has(id[j])) return {value, kBadId};
    const int64_t count = vocab(kHeadCount, id[j]), take = std::min(count, need);
    if (take == 0) return {value, kNotContinued};
    value = (value << (6 * take)) | (vocab(kHeadValue, id[j]) >> (6 * (count - take)));
    need -= take;
    visit(j);
  }
  return {value, kOk};
}

// (positions (K,) int64 of the tokens whose last character is cut, that character's code
// point (K,) int64, status).
std::tuple<at::Tensor, at::Tensor, int64_t> token_cut_characters_cpu(const at::Tensor& ids,
                                                                     const at::Tensor& table) {
  const Vocab vocab = checked_vocab(ids, table);
  const int64_t n = ids.size(0);
  const int32_t* id = ids.data_ptr<int32_t>();
  std::vector<int64_t> positions, values;
  int64_t status = kOk;
  // One byte per token id (L1-resident) and the ids' range checked once: the scan for cut
  // tokens is then a load and a branch per id.
  std::vector<uint8_t> cut(vocab);
  for (int64_t t = 0; t < vocab; ++t) cut[t] = (vocab(kFlags, static_cast<int32_t>(t)) & kCut) != 0;
  int32_t lo = 0, hi = 0;
  for (int64_t p = 0; p < n; ++p) {
    lo = std::min(lo, id[p]);
    hi = std::max(hi, id[p]);
  }
  if (n > 0 && (lo < 0 || hi >= vocab.size)) status = kBadId;
  for (int64_t p = 0; p < n && status == kOk; ++p) {
    if (cut[id[p]]) {
      const auto [value, why] = finish_cut(id, n, vocab, p, [](int64_t) {});
      positions.push_back(p);
      values.push_back(value);
      status = why;
    }
  }
  const auto k = static_cast<int64_t>(positions.size());
  at::Tensor pos = at::empty({k}, table.options()), val = at::empty({k}, table.options());
  std::copy(positions.begin(), positions.end(), pos.data_ptr<int64_t>());
  std::copy(values.begin(), values.end(), val.data_ptr<int64_t>());
  return {pos, val, status};
}

// (D, 3) int64 [Han characters, Latin words, visible characters] per document, given the
// classes (K,) int64 (kVisible | kHan | kLatin bits) of the cut characters at positions (K,).
at::Tensor token_document_stats_cpu(const at::Tensor& ids, const at::Tensor& offsets,
                                    const at::Tensor& table, const at::Tensor& positions,
                                    const at::Tensor& classes) {
  const Vocab vocab = checked_vocab(ids, table);
  TORCH_CHECK(offsets.dim() == 1 && offsets.scalar_type() == at::kLong &&
                  offsets.is_contiguous() && offsets.size(0) >= 1,
              "token_document_stats: offsets must be contiguous 1-D int64 with D + 1 entries");
  TORCH_CHECK(positions.dim() == 1 && classes.sizes() == positions.sizes() &&
                  positions.scalar_type() == at::kLong && classes.scalar_type() == at::kLong &&
                  positions.is_contiguous() && classes.is_contiguous(),
              "token_document_stats: positions and classes must be contiguous (K,) int64");
  const int64_t n = ids.size(0), docs = offsets.size(0) - 1, cuts = positions.size(0);
  at::Tensor counts = at::zeros({docs, 3}, offsets.options());
  const int32_t* id = ids.data_ptr<int32_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t* cut_at = positions.data_ptr<int64_t>();
  const int64_t* cut_class = classes.data_ptr<int64_t>();
  int64_t* out = counts.data_ptr<int64_t>();
  // The last token a cut character's bytes reach, and whether it is Latin: the bare
  // continuation tokens up to there end with that character. (The ids of a text, valid UTF-8,
  // give chains that never overlap.)
  int64_t carry_until = -1, next_cut = 0;
  bool carry_latin = false;
  for (int64_t d = 0; d < docs; ++d) {
    TORCH_CHECK(off[d] >= 0 && off[d] <= off[d + 1] && off[d + 1] <= n,
                "token_document_stats: offsets out of order or past the ids at document ", d);
    int64_t sum = 0, glued = 0, prev_flags = 0;  // no word runs on into a document
    for (int64_t p = off[d]; p < off[d + 1]; ++p) {
      const int32_t t = id[p];
      TORCH_CHECK(vocab.has(t), "token_document_stats: id ", t, " outside the vocabulary of ",
                  vocab.size);
      int64_t code = vocab(kCode, t), flags = vocab(kFlags, t);
      if (p <= carry_until && vocab(kLeads, t) == 0) {
        flags = carry_latin ? (flags | kLastLatin) : (flags & ~kLastLatin);
      }
      while (next_cut < cuts && cut_at[next_cut] < p) ++next_cut;
      if (next_cut < cuts && cut_at[next_cut] == p) {
        const int64_t c = cut_class[next_cut];
        const bool latin = c & kLatin, only = vocab(kOnlyPartial, t);
        const bool starts_word = latin && (only || !(flags & kLastLatin));
        code += int64_t{(c & kVisible) != 0} + (int64_t{(c & kHan) != 0} << kField) +
                (int64_t{starts_word} << (2 * kField));
        if (only && latin) flags |= kFirstLatin;
        flags = latin ? (flags | kLastLatin) : (flags & ~kLastLatin);
        const int64_t why =
            finish_cut(id, n, vocab, p, [&carry_until](int64_t j) { carry_until = j; }).second;
        TORCH_CHECK(why == kOk, "token_document_stats: the cut character at ", p,
                    " is not UTF-8 (token_cut_characters status ", why, ")");
        carry_latin = latin;
      }
      sum += code;
      glued += flags & (prev_flags >> 1) & kFirstLatin;  // branch-free: half the tokens
      prev_flags = flags;
    }
    out[3 * d] = (sum >> kField) & kFieldMask;
    out[3 * d + 1] = (sum >> (2 * kField)) - glued;
    out[3 * d + 2] = sum & kFieldMask;
  }
  return counts;
}

}  // namespace

TORCH_LIBRARY_IMPL(megatron_gamma, CPU, m) {
  m.impl("token_cut_characters", &token_cut_characters_cpu);
  m.impl("token_document_stats", &token_document_stats_cpu);
}

}  // namespace megatron_gamma
