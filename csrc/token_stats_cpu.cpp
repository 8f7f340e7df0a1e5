// Per-document text statistics from byte-level BPE token ids, in one pass over the ids.
//
// Implements, step for step, TokenTextStats.documents of megatron_gamma/data/token_stats.py
// (whose numpy form runs where the extension is not built; tests/test_data_token_stats.py checks
// both against the text): each token's table code (visible characters, Han characters, Latin
// words starting in it: three 21-bit fields of one int64) is added to its document's sum; a
// token whose last character is cut finishes that character from the continuation bytes the
// next tokens start with, adds it as the caller's code-point classes say (Han, Latin, visible),
// and fixes the first/last-Latin flags of the tokens the character spans; a Latin word running
// on from the previous token of the same document is subtracted once; the tokens holding a control
// character (flag kControl) are counted. The caller's table covers the low code points; a cut
// character above it that the caller has not classified yet is returned, and the caller runs the
// pass again with its class (token_stats.py).
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
constexpr int64_t kFirstLatin = 1, kLastLatin = 2, kCut = 4, kControl = 8;
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
// Statuses; token_stats.py raises the matching ValueError, or classifies the characters
// returned with kNeedClasses and runs the pass again.
constexpr int64_t kOk = 0, kEndsInside = 1, kNotContinued = 2, kBadId = 3, kNeedClasses = 4;

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

// (counts (D, 4) int64 [Han characters, Latin words, visible characters, tokens holding a control
// character] per document, status,
// the code points (int64, sorted) of cut characters that neither classes (uint8, by code point
// below its length) nor extra_values / extra_classes (int64, sorted by value) classify).
std::tuple<at::Tensor, int64_t, at::Tensor> token_document_stats_cpu(
    const at::Tensor& ids, const at::Tensor& offsets, const at::Tensor& table,
    const at::Tensor& classes, const at::Tensor& extra_values, const at::Tensor& extra_classes) {
  const Vocab vocab = checked_vocab(ids, table);
  TORCH_CHECK(offsets.dim() == 1 && offsets.scalar_type() == at::kLong &&
                  offsets.is_contiguous() && offsets.size(0) >= 1,
              "token_document_stats: offsets must be contiguous 1-D int64 with D + 1 entries");
  TORCH_CHECK(classes.dim() == 1 && classes.scalar_type() == at::kByte && classes.is_contiguous(),
              "token_document_stats: classes must be contiguous 1-D uint8");
  TORCH_CHECK(extra_values.dim() == 1 && extra_classes.sizes() == extra_values.sizes() &&
                  extra_values.scalar_type() == at::kLong &&
                  extra_classes.scalar_type() == at::kLong && extra_values.is_contiguous() &&
                  extra_classes.is_contiguous(),
              "token_document_stats: extra_values and extra_classes must be contiguous (K,) int64");
  const int64_t n = ids.size(0), docs = offsets.size(0) - 1;
  at::Tensor counts = at::zeros({docs, 4}, offsets.options());
  const int32_t* id = ids.data_ptr<int32_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const uint8_t* low = classes.data_ptr<uint8_t>();
  const int64_t lows = classes.size(0), extras = extra_values.size(0);
  const int64_t* extra_value = extra_values.data_ptr<int64_t>();
  const int64_t* extra_class = extra_classes.data_ptr<int64_t>();
  int64_t* out = counts.data_ptr<int64_t>();
  std::vector<int64_t> missing;
  const auto fail = [&](int64_t status) {
    return std::make_tuple(counts, status, at::empty({0}, offsets.options()));
  };
  int32_t lo = 0, hi = 0;
  for (int64_t p = 0; p < n; ++p) {
    lo = std::min(lo, id[p]);
    hi = std::max(hi, id[p]);
  }
  if (n > 0 && (lo < 0 || hi >= vocab.size)) return fail(kBadId);
  // The last token a cut character's bytes reach, and whether it is Latin: the bare
  // continuation tokens up to there end with that character. (The ids of a text, valid UTF-8,
  // give chains that never overlap.)
  int64_t carry_until = -1;
  bool carry_latin = false;
  for (int64_t d = 0; d < docs; ++d) {
    TORCH_CHECK(off[d] >= 0 && off[d] <= off[d + 1] && off[d + 1] <= n,
                "token_document_stats: offsets out of order or past the ids at document ", d);
    int64_t sum = 0, glued = 0, controls = 0, prev_flags = 0;  // no word runs on into a document
    for (int64_t p = off[d]; p < off[d + 1]; ++p) {
      const int32_t t = id[p];
      int64_t code = vocab(kCode, t), flags = vocab(kFlags, t);
      if (p <= carry_until && vocab(kLeads, t) == 0) {
        flags = carry_latin ? (flags | kLastLatin) : (flags & ~kLastLatin);
      }
      if (flags & kCut) {
        const auto [value, why] =
            finish_cut(id, n, vocab, p, [&carry_until](int64_t j) { carry_until = j; });
        if (why != kOk) return fail(why);
        int64_t c = 0;
        if (value < lows) {
          c = low[value];
        } else {
          const int64_t* at = std::lower_bound(extra_value, extra_value + extras, value);
          if (at != extra_value + extras && *at == value) {
            c = extra_class[at - extra_value];
          } else {
            missing.push_back(value);
          }
        }
        const bool latin = c & kLatin, only = vocab(kOnlyPartial, t);
        const bool starts_word = latin && (only || !(flags & kLastLatin));
        code += int64_t{(c & kVisible) != 0} + (int64_t{(c & kHan) != 0} << kField) +
                (int64_t{starts_word} << (2 * kField));
        if (only && latin) flags |= kFirstLatin;
        flags = latin ? (flags | kLastLatin) : (flags & ~kLastLatin);
        carry_latin = latin;
      }
      sum += code;
      glued += flags & (prev_flags >> 1) & kFirstLatin;  // branch-free: half the tokens
      controls += (flags & kControl) >> 3;
      prev_flags = flags;
    }
    out[4 * d] = (sum >> kField) & kFieldMask;
    out[4 * d + 1] = (sum >> (2 * kField)) - glued;
    out[4 * d + 2] = sum & kFieldMask;
    out[4 * d + 3] = controls;
  }
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  at::Tensor unknown = at::empty({static_cast<int64_t>(missing.size())}, offsets.options());
  std::copy(missing.begin(), missing.end(), unknown.data_ptr<int64_t>());
  return {counts, missing.empty() ? kOk : kNeedClasses, unknown};
}

}  // namespace

TORCH_LIBRARY_IMPL(megatron_gamma, CPU, m) {
  m.impl("token_document_stats", &token_document_stats_cpu);
}

}  // namespace megatron_gamma
