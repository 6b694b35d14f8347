// Token-level losses on log-probs: masked cross-entropy (SFT) and the RL policy losses (PPO clip with dual clip,
// GSPO, CISPO; the decoupled proximal/behaviour objective with truncated or masked importance weights, KL to a
// reference, entropy bonus), with verl's aggregation modes. Pure scalar code on [T] arrays; the vocabulary never
// appears here.
#pragma once
#include <cstdint>
#include <vector>

#include "model.h"

namespace rls {

enum class Agg { TokenMean, SeqMeanTokenSum, SeqMeanTokenMean };
enum class KlType { K1, K2, K3 };

// Per-token weights a[t] such that agg(x) = sum_t a[t] * x[t] (verl agg_loss). Sequences without any masked token
// are left out of the seq-mean modes (no 0/0). `tokens` = number of positions with response_mask != 0.
std::vector<double> aggregation_weights(const float* response_mask, const int32_t* seq_starts, int S, int T, Agg agg,
                                        double* tokens);

// Mean over masked tokens of -log p(target), times scale.
class CrossEntropyLoss final : public TokenLoss {
 public:
  CrossEntropyLoss(const float* response_mask, const int32_t* seq_starts, int S, int T, float scale);
  void chunk(int t0, int n, const float* logp, const float* ent, float* dlogp, float* dent) override;
  double loss() const { return loss_ * scale_; }
  double tokens() const { return tokens_; }

 private:
  const float* response_mask_;
  std::vector<double> w_;
  double scale_, loss_ = 0, tokens_ = 0;
};

// The policy losses, one kernel each (losses.cpp, table kPolicyLosses). Adding one: a value here, its kernel
// function and its row in the table; the TypeScript registry entry (consumers/trainer/policy-losses.ts) names it.
enum class PolicyLossKind { Ppo, Gspo, Cispo };

// Correction of the behaviour-vs-proximal mismatch (the decoupled objective's importance weight
// w = pi_prox / pi_behaviour), per token or per sequence (product of the token ratios).
enum class CorrectionMode { Off, Truncate, Mask };  // Off: w = 1; Truncate: min(w, cap); Mask: w in [low, high], else 0
enum class CorrectionLevel { Token, Sequence };

// No member has a default: every value comes from the compiled TypeScript options (native/model.ts
// compilePolicyLossOptions, the trainer's config), where each default lives once; the glue sets every field, and
// test/config/defaults.test.ts checks that this struct stays without defaults.
struct PolicyLossOptions {
  PolicyLossKind kind;
  double clip_low, clip_high;
  double dual_clip_c;  // ppo only; <= 0: off; otherwise > 1
  CorrectionMode correction;
  CorrectionLevel correction_level;
  double iw_cap;               // Truncate; <= 0: Off
  double mask_low, mask_high;  // Mask
  double kl_coef;
  KlType kl_type;
  double entropy_coef;
  Agg agg;
  double scale;
};

struct PolicyLossInputs {
  const float* response_mask = nullptr;        // [T]
  const float* advantages = nullptr;  // [T]
  const float* behaviour = nullptr;   // [T] log-probs of the policy that generated the tokens
  const float* proximal = nullptr;    // [T] or null (= behaviour: plain PPO)
  const float* ref = nullptr;         // [T] or null (no KL term)
};

// One token's surrogate as a function of x, the log-ratio log(pi / pi_prox) the loss is defined on (the token's,
// or its sequence's for a sequence-level loss), and its advantage. A stop-gradient factor is computed from x and
// left out of dloss_dx.
struct PgTerm {
  double loss = 0, dloss_dx = 0;
  bool clipped = false, dual = false;
};
using PgKernel = PgTerm (*)(double x, double A, const PolicyLossOptions& o);

struct PolicyLossEntry {
  PolicyLossKind kind;
  const char* name;
  PgKernel kernel;
  bool sequence_level;  // x is the sequence's mean token log-ratio (GSPO)
};
const PolicyLossEntry& policy_loss_entry(PolicyLossKind kind);
// The entry named `name`, or null.
const PolicyLossEntry* policy_loss_by_name(const char* name);

struct PolicyLossMetrics {
  double loss = 0, pg_loss = 0, clip_fraction = 0, dual_clip_fraction = 0, approx_kl = 0, entropy = 0, kl = 0,
         iw_mean = 0, iw_max = 0, iw_truncated_fraction = 0, iw_masked_fraction = 0, tokens = 0;
};

class PolicyLoss final : public TokenLoss {
 public:
  PolicyLoss(const PolicyLossInputs& in, const PolicyLossOptions& opt, const int32_t* seq_starts, int S, int T);
  void chunk(int t0, int n, const float* logp, const float* ent, float* dlogp, float* dent) override;
  bool needs_logp() const override { return entry_->sequence_level; }
  void prepare(const float* logp) override;
  PolicyLossMetrics metrics() const;

 private:
  PolicyLossInputs in_;
  PolicyLossOptions o_;
  const PolicyLossEntry* entry_;
  std::vector<double> w_;   // aggregation weights
  std::vector<double> iw_;  // correction weights (0 where masked)
  std::vector<int> seq_of_;
  std::vector<double> seq_m_, seq_x_, seq_g_;  // per sequence: response_mask sum, log-ratio, d pg / d x
  double tokens_ = 0, msum_ = 0;
  double pg_ = 0, ent_ = 0, kl_ = 0, clip_ = 0, dual_ = 0, akl_ = 0, iw_sum_ = 0, iw_max_ = 0, trunc_ = 0, masked_ = 0;
};

}  // namespace rls
