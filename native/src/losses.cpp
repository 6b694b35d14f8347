// Policy and cross-entropy losses per token, with their derivatives with respect to log p and entropy.
// Semantics follow verl's core_algos (compute_policy_loss, kl_penalty, agg_loss) and AReaL's decoupled PPO.
#include "losses.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace rls {

std::vector<double> aggregation_weights(const float* response_mask, const int32_t* seq_starts, int S, int T, Agg agg,
                                        double* tokens) {
  std::vector<double> w((size_t)T, 0.0);
  double total = 0, count = 0;
  int seqs = 0;
  for (int s = 0; s < S; s++) {
    double m = 0;
    for (int t = seq_starts[s]; t < seq_starts[s + 1]; t++) {
      m += response_mask[t];
      if (response_mask[t] != 0.f) count += 1;
    }
    total += m;
    if (m != 0) seqs++;
  }
  *tokens = count;
  for (int s = 0; s < S; s++) {
    double m = 0;
    for (int t = seq_starts[s]; t < seq_starts[s + 1]; t++) m += response_mask[t];
    if (m == 0) continue;
    for (int t = seq_starts[s]; t < seq_starts[s + 1]; t++) {
      switch (agg) {
        case Agg::TokenMean: w[t] = response_mask[t] / total; break;
        case Agg::SeqMeanTokenSum: w[t] = response_mask[t] / (double)seqs; break;
        case Agg::SeqMeanTokenMean: w[t] = response_mask[t] / m / (double)seqs; break;
      }
    }
  }
  return w;
}

CrossEntropyLoss::CrossEntropyLoss(const float* response_mask, const int32_t* seq_starts, int S, int T, float scale)
    : response_mask_(response_mask), scale_(scale) {
  w_ = aggregation_weights(response_mask, seq_starts, S, T, Agg::TokenMean, &tokens_);
}

void CrossEntropyLoss::chunk(int t0, int n, const float* logp, const float*, float* dlogp, float* dent) {
  for (int i = 0; i < n; i++) {
    const double w = w_[(size_t)(t0 + i)];
    loss_ -= w * logp[i];
    dlogp[i] = (float)(-w * scale_);
    dent[i] = 0.f;
  }
}

static inline double clampd(double x, double lo, double hi) { return std::min(hi, std::max(lo, x)); }

// max(-A r, -A clip(r, 1 - low, 1 + high)) with r = e^x (log-ratio clamped to +-20, gradient zero outside); for
// A < 0 and c > 0 also min(that, -A c) (dual clip).
static PgTerm clipped_surrogate(double x, double A, double low, double high, double dual_c) {
  const double xc = clampd(x, -20, 20), ratio = std::exp(xc), dratio = (x > -20 && x < 20) ? ratio : 0.0;
  const double l1 = -A * ratio, l2 = -A * clampd(ratio, 1 - low, 1 + high);
  PgTerm r;
  double dloss_dratio;
  if (l2 > l1) {
    r.loss = l2;
    dloss_dratio = 0;  // l2 > l1 only where the clamp is active
    r.clipped = true;
  } else {
    r.loss = l1;
    dloss_dratio = -A;
  }
  if (dual_c > 0 && A < 0) {
    const double l3 = -A * dual_c;
    if (l3 < r.loss) {
      r.loss = l3;
      dloss_dratio = 0;
      r.dual = true;
    }
  }
  r.dloss_dx = dloss_dratio * dratio;
  return r;
}

// PPO (verl vanilla + dual clip) on the token ratio pi / pi_prox.
static PgTerm ppo_kernel(double x, double A, const PolicyLossOptions& o) {
  return clipped_surrogate(x, A, o.clip_low, o.clip_high, o.dual_clip_c);
}

// GSPO (Zheng et al. 2025): the same clipped surrogate on the sequence ratio, the geometric mean of its token
// ratios; every token of the sequence shares it, and the gradient reaches each token through the mean.
static PgTerm gspo_kernel(double x, double A, const PolicyLossOptions& o) {
  return clipped_surrogate(x, A, o.clip_low, o.clip_high, 0);
}

// CISPO (MiniMax-M1): -sg(clip(r, 1 - low, 1 + high)) * A * log r. The clipped weight is a stop-gradient
// coefficient, so every token keeps a gradient (PPO's clip zeroes it); log r = log pi - sg(log pi_prox) has the
// gradient of log pi.
static PgTerm cispo_kernel(double x, double A, const PolicyLossOptions& o) {
  const double r = std::exp(clampd(x, -20, 20));
  const double w = clampd(r, 1 - o.clip_low, 1 + o.clip_high);
  PgTerm t;
  t.loss = -w * A * x;
  t.dloss_dx = -w * A;
  t.clipped = w != r;
  return t;
}

static const PolicyLossEntry kPolicyLosses[] = {
    {PolicyLossKind::Ppo, "ppo", ppo_kernel, false},
    {PolicyLossKind::Gspo, "gspo", gspo_kernel, true},
    {PolicyLossKind::Cispo, "cispo", cispo_kernel, false},
};

const PolicyLossEntry& policy_loss_entry(PolicyLossKind kind) {
  for (const PolicyLossEntry& e : kPolicyLosses)
    if (e.kind == kind) return e;
  return kPolicyLosses[0];
}

const PolicyLossEntry* policy_loss_by_name(const char* name) {
  for (const PolicyLossEntry& e : kPolicyLosses)
    if (std::strcmp(e.name, name) == 0) return &e;
  return nullptr;
}

PolicyLoss::PolicyLoss(const PolicyLossInputs& in, const PolicyLossOptions& opt, const int32_t* seq_starts, int S,
                       int T)
    : in_(in), o_(opt), entry_(&policy_loss_entry(opt.kind)) {
  // A cap <= 0 keeps its meaning from before the correction modes: no weight.
  if (o_.correction == CorrectionMode::Truncate && o_.iw_cap <= 0) o_.correction = CorrectionMode::Off;
  w_ = aggregation_weights(in.response_mask, seq_starts, S, T, opt.agg, &tokens_);
  for (int t = 0; t < T; t++) msum_ += in.response_mask[t];
  seq_of_.assign((size_t)T, 0);
  seq_m_.assign((size_t)S, 0);
  seq_x_.assign((size_t)S, 0);
  seq_g_.assign((size_t)S, 0);
  std::vector<double> seq_lw((size_t)S, 0);  // sum of masked log(pi_prox / pi_behaviour)
  for (int s = 0; s < S; s++)
    for (int t = seq_starts[s]; t < seq_starts[s + 1]; t++) {
      seq_of_[(size_t)t] = s;
      seq_m_[(size_t)s] += in.response_mask[t];
      if (in.proximal) seq_lw[(size_t)s] += in.response_mask[t] * ((double)in.proximal[t] - in.behaviour[t]);
    }

  // Rollout correction: the detached weight pi_prox / pi_behaviour of each token (or of its sequence).
  iw_.assign((size_t)T, 1.0);
  for (int t = 0; t < T; t++) {
    const double m = in.response_mask[t];
    if (m == 0) continue;
    const double mw = m / msum_;  // weight of a plain masked mean (metrics)
    if (o_.correction == CorrectionMode::Off) {
      iw_sum_ += mw;
      iw_max_ = std::max(iw_max_, 1.0);
      continue;
    }
    const double lw = o_.correction_level == CorrectionLevel::Sequence
                          ? seq_lw[(size_t)seq_of_[(size_t)t]]
                          : (in.proximal ? (double)in.proximal[t] - in.behaviour[t] : 0.0);
    const double raw = std::exp(clampd(lw, -20, 20));
    iw_sum_ += mw * raw;
    iw_max_ = std::max(iw_max_, raw);
    if (o_.correction == CorrectionMode::Truncate) {
      if (raw > o_.iw_cap) trunc_ += mw;
      iw_[(size_t)t] = std::min(raw, o_.iw_cap);
    } else {
      const bool keep = raw >= o_.mask_low && raw <= o_.mask_high;
      if (!keep) masked_ += mw;
      iw_[(size_t)t] = keep ? raw : 0.0;
    }
  }
}

void PolicyLoss::prepare(const float* logp) {
  // The sequence log-ratio (masked mean of the token log-ratios) and d pg / d x summed over the sequence's tokens.
  std::fill(seq_x_.begin(), seq_x_.end(), 0.0);
  std::fill(seq_g_.begin(), seq_g_.end(), 0.0);
  const size_t T = seq_of_.size();
  for (size_t t = 0; t < T; t++) {
    const double m = in_.response_mask[t];
    if (m == 0) continue;
    const double prox = in_.proximal ? in_.proximal[t] : in_.behaviour[t];
    seq_x_[(size_t)seq_of_[t]] += m * ((double)logp[t] - prox);
  }
  for (size_t s = 0; s < seq_x_.size(); s++)
    if (seq_m_[s] != 0) seq_x_[s] /= seq_m_[s];
  for (size_t t = 0; t < T; t++) {
    if (in_.response_mask[t] == 0) continue;
    const size_t s = (size_t)seq_of_[t];
    seq_g_[s] += w_[t] * iw_[t] * entry_->kernel(seq_x_[s], in_.advantages[t], o_).dloss_dx;
  }
}

void PolicyLoss::chunk(int t0, int n, const float* logp, const float* ent, float* dlogp, float* dent) {
  for (int i = 0; i < n; i++) {
    const int t = t0 + i;
    const double m = in_.response_mask[t];
    if (m == 0) {
      dlogp[i] = 0.f;
      dent[i] = 0.f;
      continue;
    }
    const double a = w_[(size_t)t];  // aggregation weight
    const double mw = m / msum_;     // weight of a plain masked mean (metrics)
    const double lp = logp[i];
    const double prox = in_.proximal ? in_.proximal[t] : in_.behaviour[t];
    const double A = in_.advantages[t];
    const double iw = iw_[(size_t)t];
    const double dl = lp - prox;
    akl_ += mw * -clampd(dl, -20, 20);

    const size_t s = (size_t)seq_of_[(size_t)t];
    const PgTerm term = entry_->kernel(entry_->sequence_level ? seq_x_[s] : dl, A, o_);
    if (term.clipped) clip_ += mw;
    if (term.dual) dual_ += mw;
    pg_ += a * iw * term.loss;
    // d loss / d logp. Sequence-level: x is the masked mean of the sequence's log-ratios, and seq_g_ already
    // carries the aggregation and correction weights of every token that shares it.
    double g = entry_->sequence_level ? seq_g_[s] * m / seq_m_[s] : a * iw * term.dloss_dx;

    // KL to the reference policy, x = log pi - log pi_ref clamped to +-20 (verl kl_penalty)
    if (in_.ref) {
      const double x0 = lp - in_.ref[t], x = clampd(x0, -20, 20), dx = (x0 > -20 && x0 < 20) ? 1.0 : 0.0;
      double kl, dkl;
      switch (o_.kl_type) {
        case KlType::K1: kl = x; dkl = 1; break;
        case KlType::K2: kl = 0.5 * x * x; dkl = x; break;
        default: {
          const double e = std::exp(-x);
          kl = e + x - 1;
          dkl = 1 - e;
          if (kl > 10) { kl = 10; dkl = 0; }
          if (kl < -10) { kl = -10; dkl = 0; }
        }
      }
      kl_ += a * kl;
      g += a * o_.kl_coef * dkl * dx;
    }
    ent_ += a * ent[i];
    dlogp[i] = (float)(o_.scale * g);
    dent[i] = (float)(o_.scale * a * -o_.entropy_coef);
  }
}

PolicyLossMetrics PolicyLoss::metrics() const {
  PolicyLossMetrics r;
  const bool any = msum_ != 0;
  r.pg_loss = pg_;
  r.entropy = ent_;
  r.kl = kl_;
  r.loss = o_.scale * (pg_ + (in_.ref ? o_.kl_coef * kl_ : 0.0) - o_.entropy_coef * ent_);
  r.clip_fraction = any ? clip_ : 0;
  r.dual_clip_fraction = any ? dual_ : 0;
  r.approx_kl = any ? akl_ : 0;
  r.iw_mean = any ? iw_sum_ : 0;
  r.iw_max = iw_max_;
  r.iw_truncated_fraction = any ? trunc_ : 0;
  r.iw_masked_fraction = any ? masked_ : 0;
  r.tokens = tokens_;
  return r;
}

}  // namespace rls
