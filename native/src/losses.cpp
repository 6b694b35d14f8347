// Policy and cross-entropy losses per token, with their derivatives with respect to log p and entropy.
// Semantics follow verl's core_algos (compute_policy_loss, kl_penalty, agg_loss) and AReaL's decoupled PPO.
#include "losses.h"

#include <algorithm>
#include <cmath>

namespace rls {

std::vector<double> aggregation_weights(const float* mask, const int32_t* seq_starts, int S, int T, Agg agg,
                                        double* tokens) {
  std::vector<double> w((size_t)T, 0.0);
  double total = 0, count = 0;
  int seqs = 0;
  for (int s = 0; s < S; s++) {
    double m = 0;
    for (int t = seq_starts[s]; t < seq_starts[s + 1]; t++) {
      m += mask[t];
      if (mask[t] != 0.f) count += 1;
    }
    total += m;
    if (m != 0) seqs++;
  }
  *tokens = count;
  for (int s = 0; s < S; s++) {
    double m = 0;
    for (int t = seq_starts[s]; t < seq_starts[s + 1]; t++) m += mask[t];
    if (m == 0) continue;
    for (int t = seq_starts[s]; t < seq_starts[s + 1]; t++) {
      switch (agg) {
        case Agg::TokenMean: w[t] = mask[t] / total; break;
        case Agg::SeqMeanTokenSum: w[t] = mask[t] / (double)seqs; break;
        case Agg::SeqMeanTokenMean: w[t] = mask[t] / m / (double)seqs; break;
      }
    }
  }
  return w;
}

CrossEntropyLoss::CrossEntropyLoss(const float* mask, const int32_t* seq_starts, int S, int T, float scale)
    : mask_(mask), scale_(scale) {
  w_ = aggregation_weights(mask, seq_starts, S, T, Agg::TokenMean, &tokens_);
}

void CrossEntropyLoss::chunk(int t0, int n, const float* logp, const float*, float* dlogp, float* dent) {
  for (int i = 0; i < n; i++) {
    const double w = w_[(size_t)(t0 + i)];
    loss_ -= w * logp[i];
    dlogp[i] = (float)(-w * scale_);
    dent[i] = 0.f;
  }
}

PolicyLoss::PolicyLoss(const PolicyLossInputs& in, const PolicyLossOptions& opt, const int32_t* seq_starts, int S,
                       int T)
    : in_(in), o_(opt) {
  w_ = aggregation_weights(in.mask, seq_starts, S, T, opt.agg, &tokens_);
  for (int t = 0; t < T; t++) msum_ += in.mask[t];
}

static inline double clampd(double x, double lo, double hi) { return std::min(hi, std::max(lo, x)); }

void PolicyLoss::chunk(int t0, int n, const float* logp, const float* ent, float* dlogp, float* dent) {
  for (int i = 0; i < n; i++) {
    const int t = t0 + i;
    const double m = in_.mask[t];
    if (m == 0) {
      dlogp[i] = 0.f;
      dent[i] = 0.f;
      continue;
    }
    const double a = w_[(size_t)t];  // aggregation weight
    const double mw = m / msum_;     // weight of a plain masked mean (metrics)
    const double lp = logp[i], behav = in_.behaviour[t];
    const double prox = in_.proximal ? in_.proximal[t] : behav;
    const double A = in_.advantages[t];

    // ratio = pi / pi_prox, log-ratio clamped to +-20 (gradient zero outside)
    const double dl = lp - prox, dlc = clampd(dl, -20, 20);
    const double ratio = std::exp(dlc), dratio = (dl > -20 && dl < 20) ? ratio : 0.0;
    akl_ += mw * -dlc;

    // decoupled objective: detached, truncated importance weight pi_prox / pi_behaviour
    double iw = 1;
    if (o_.iw_cap > 0) {
      const double raw = std::exp(clampd(prox - behav, -20, 20));
      iw_sum_ += mw * raw;
      iw_max_ = std::max(iw_max_, raw);
      if (raw > o_.iw_cap) trunc_ += mw;
      iw = std::min(raw, o_.iw_cap);
    } else {
      iw_sum_ += mw;
      iw_max_ = std::max(iw_max_, 1.0);
    }

    // PPO clip: max(-A r, -A clip(r)); dual clip: for A < 0, min(that, -A c)
    const double l1 = -A * ratio, l2 = -A * clampd(ratio, 1 - o_.clip_low, 1 + o_.clip_high);
    double loss, dloss_dratio;
    if (l2 > l1) {
      loss = l2;
      dloss_dratio = 0;  // l2 > l1 only where the clamp is active
      clip_ += mw;
    } else {
      loss = l1;
      dloss_dratio = -A;
    }
    if (o_.dual_clip_c > 0 && A < 0) {
      const double l3 = -A * o_.dual_clip_c;
      if (l3 < loss) {
        loss = l3;
        dloss_dratio = 0;
        dual_ += mw;
      }
    }
    pg_ += a * iw * loss;
    double g = iw * dloss_dratio * dratio;  // d pg_token / d logp

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
      g += o_.kl_coef * dkl * dx;
    }
    ent_ += a * ent[i];
    dlogp[i] = (float)(o_.scale * a * g);
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
  r.tokens = tokens_;
  return r;
}

}  // namespace rls
