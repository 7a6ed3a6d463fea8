// tunelab's CPU experts block (model/moe_native.py builds it): each expert's whole MLP -- its rows gathered, the
// gate_up product with its LoRA, the SiLU gate, the down product with its LoRA, its rows scattered back -- runs on
// one core, the experts shared out between the cores largest first (at::parallel_for over the threads, an atomic
// counter over the experts). ATen runs the products and elementwise ops inside a parallel region single-threaded
// (oneDNN and MKL see omp_in_parallel), so no OpenMP team is split over a 128-row product.
//
// Layout: each expert's rows sit in buffers of its row count rounded up to 16 sizes per power of two (moe.rounded),
// the rows past its own zero: oneDNN builds a kernel per product shape, and exact counts changing every step made
// new shapes every step.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <type_traits>
#include <atomic>
#include <cstring>
#include <numeric>
#include <optional>
#include <vector>

using at::Tensor;

namespace {

int64_t rounded(int64_t n) {
  int64_t bits = 0;
  for (int64_t v = n; v; v >>= 1) bits++;
  int64_t step = int64_t(1) << std::max<int64_t>(0, bits - 5);
  return (n + step - 1) / step * step;
}

struct Plan {
  std::vector<int64_t> count, start, rstart, order;  // per expert: rows, first sorted row, first rounded row
  int64_t rrows = 0;
};

Plan plan(const Tensor& counts) {
  Plan p;
  auto c = counts.contiguous();
  const int64_t* n = c.data_ptr<int64_t>();
  int64_t e = c.numel(), s = 0;
  for (int64_t i = 0; i < e; i++) {
    p.count.push_back(n[i]);
    p.start.push_back(s);
    p.rstart.push_back(p.rrows);
    s += n[i];
    p.rrows += n[i] ? rounded(n[i]) : 0;
  }
  p.order.resize(e);
  std::iota(p.order.begin(), p.order.end(), 0);
  std::stable_sort(p.order.begin(), p.order.end(), [&](int64_t a, int64_t b) { return p.count[a] > p.count[b]; });
  return p;
}

// f(e) for every expert with rows, largest first, each on one core.
template <typename F>
void each_expert(const Plan& p, const F& f) {
  std::atomic<int64_t> next{0};
  int64_t busy = 0;
  for (auto n : p.count) busy += n > 0;
  int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), busy));
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t i = next++; i < busy; i = next++) f(p.order[i]);
  });
}

// rows of `src` (row i of expert e from src row index[start + i], or `div` of it) into `dst` rows [0, n), zeros
// past them up to dst's rows.
void gather(const Tensor& dst, const Tensor& src, const int64_t* index, int64_t n, int64_t div) {
  const int64_t width = src.size(1) * src.element_size();
  char* d = static_cast<char*>(dst.data_ptr());
  const char* s = static_cast<const char*>(src.data_ptr());
  for (int64_t i = 0; i < n; i++) std::memcpy(d + i * width, s + (index[i] / div) * width, width);
  std::memset(d + n * width, 0, (dst.size(0) - n) * width);
}

void scatter(const Tensor& dst, const Tensor& src, const int64_t* index, int64_t n) {
  const int64_t width = src.size(1) * src.element_size();
  char* d = static_cast<char*>(dst.data_ptr());
  const char* s = static_cast<const char*>(src.data_ptr());
  for (int64_t i = 0; i < n; i++) std::memcpy(d + index[i] * width, s + i * width, width);
}

// out = a·b, out a view (a row block of a bigger buffer).
void into(Tensor out, const Tensor& a, const Tensor& b) { at::mm_out(out, a, b); }

Tensor rows(const Tensor& t, const Plan& p, int64_t e) { return t.narrow(0, p.rstart[e], rounded(p.count[e])); }

Tensor gate(const Tensor& gu) {
  int64_t half = gu.size(1) / 2;
  return at::mul(at::silu(gu.narrow(1, 0, half)), gu.narrow(1, half, half));
}

// LoRA's rank-r products on one expert's rows: register-blocked loops in fp32 (16-float vectors) for ranks 16, 32 and 64,
// else fp32 products through MKL. oneDNN's bf16 products cost 20-40 us of call overhead each at rank 16, more than
// their arithmetic; these run in a few microseconds. Rows (rows, width) row-major in T; the factors fp32.
typedef float V __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register, two AVX2 ones
typedef uint32_t U32 __attribute__((vector_size(64)));
typedef uint16_t U16 __attribute__((vector_size(32)));
constexpr int L = 16;

inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline V load(const c10::BFloat16* p) {
  U16 u;
  std::memcpy(&u, p, sizeof(u));
  U32 w = __builtin_convertvector(u, U32) << 16;
  V v;
  std::memcpy(&v, &w, sizeof(v));
  return v;
}
inline void store(float* p, V v) { std::memcpy(p, &v, sizeof(v)); }
inline void store(c10::BFloat16* p, V v) {  // round to nearest even, as c10::BFloat16 does; NaN stays NaN
  U32 w;
  std::memcpy(&w, &v, sizeof(w));
  U32 r = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
  r = ((w & 0x7FFFFFFFu) > 0x7F800000u) ? U32{} + 0x7FC0u : r;
  U16 u = __builtin_convertvector(r, U16);
  std::memcpy(p, &u, sizeof(u));
}

template <typename T, int R>
struct Thin {
  static constexpr int N = R / L;  // vectors per rank row
  // out (rows, R) = x (rows, k) · m (k, R)
  static void xm(const T* x, int64_t k, const float* m, int64_t rows, float* out) {
    constexpr int B = 8;
    for (int64_t i = 0; i < rows; i += B) {
      const int b_end = static_cast<int>(std::min<int64_t>(B, rows - i));
      V acc[B][N] = {};
      for (int64_t c = 0; c < k; c++) {
        V mc[N];
        for (int q = 0; q < N; q++) mc[q] = load(m + c * R + q * L);
        for (int b = 0; b < B; b++) {
          const float v = b < b_end ? static_cast<float>(x[(i + b) * k + c]) : 0.f;
          for (int q = 0; q < N; q++) acc[b][q] += v * mc[q];
        }
      }
      for (int b = 0; b < b_end; b++)
        for (int q = 0; q < N; q++) store(out + (i + b) * R + q * L, acc[b][q]);
    }
  }
  // y (rows, n) += h (rows, R) · m (R, n)
  static void add_hm(T* y, int64_t n, const float* h, const float* m, int64_t rows) {
    constexpr int C = 4;  // vectors of columns at a time
    for (int64_t i = 0; i < rows; i++) {
      const float* hi = h + i * R;
      T* yi = y + i * n;
      int64_t c0 = 0;
      for (; c0 + C * L <= n; c0 += C * L) {
        V acc[C];
        for (int q = 0; q < C; q++) acc[q] = load(yi + c0 + q * L);
        for (int j = 0; j < R; j++) {
          const float v = hi[j];
          for (int q = 0; q < C; q++) acc[q] += v * load(m + j * n + c0 + q * L);
        }
        for (int q = 0; q < C; q++) store(yi + c0 + q * L, acc[q]);
      }
      for (; c0 < n; c0++) {
        float acc = static_cast<float>(yi[c0]);
        for (int j = 0; j < R; j++) acc += hi[j] * m[j * n + c0];
        yi[c0] = static_cast<T>(acc);
      }
    }
  }
  // out (R, n) = h (rows, R)ᵀ · d (rows, n)
  static void htd(const float* h, const T* d, int64_t n, int64_t rows, float* out) {
    int64_t c0 = 0;
    for (; c0 + L <= n; c0 += L) {
      V acc[R] = {};
      for (int64_t i = 0; i < rows; i++) {
        const V dv = load(d + i * n + c0);
        const float* hi = h + i * R;
        for (int j = 0; j < R; j++) acc[j] += hi[j] * dv;
      }
      for (int j = 0; j < R; j++) store(out + j * n + c0, acc[j]);
    }
    for (; c0 < n; c0++)
      for (int j = 0; j < R; j++) {
        float acc = 0.f;
        for (int64_t i = 0; i < rows; i++) acc += h[i * R + j] * static_cast<float>(d[i * n + c0]);
        out[j * n + c0] = acc;
      }
  }
  // out (k, R) = x (rows, k)ᵀ · g (rows, R)
  static void xtg(const T* x, int64_t k, const float* g, int64_t rows, float* out) {
    constexpr int B = 8;
    for (int64_t c0 = 0; c0 < k; c0 += B) {
      const int w = static_cast<int>(std::min<int64_t>(B, k - c0));
      V acc[B][N] = {};
      for (int64_t i = 0; i < rows; i++) {
        V gi[N];
        for (int q = 0; q < N; q++) gi[q] = load(g + i * R + q * L);
        for (int b = 0; b < B; b++) {
          const float v = b < w ? static_cast<float>(x[i * k + c0 + b]) : 0.f;
          for (int q = 0; q < N; q++) acc[b][q] += v * gi[q];
        }
      }
      for (int b = 0; b < w; b++)
        for (int q = 0; q < N; q++) store(out + (c0 + b) * R + q * L, acc[b][q]);
    }
  }
};

// One projection's LoRA on one expert's `real` rows (of the buffers' `rows`): forward h = x·A (into h, fp32, the
// rows past `real` zero), y += h·B. a (k, r), b (r, n), at = aᵀ, bt = bᵀ, fp32 contiguous.
template <int R>
bool lora_forward_fixed(const Tensor& x, const Tensor& y, const Tensor& a, const Tensor& b, const Tensor& h,
                        int64_t real) {
  if (a.size(1) != R) return false;
  const int64_t k = x.size(1), n = y.size(1);
  float* hp = h.data_ptr<float>();
  auto run = [&](auto* xp, auto* yp) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(xp)>>;
    Thin<T, R>::xm(xp, k, a.data_ptr<float>(), real, hp);
    std::fill(hp + real * R, hp + h.size(0) * R, 0.f);
    Thin<T, R>::add_hm(yp, n, hp, b.data_ptr<float>(), real);
  };
  if (x.scalar_type() == at::kBFloat16)
    run(x.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>());
  else
    run(x.data_ptr<float>(), y.data_ptr<float>());
  return true;
}

// Its backward for dy (rows, n): dh = dy·Bᵀ, dB = hᵀ·dy, dA = xᵀ·dh (into da (k, r), db (r, n)), dx += dh·Aᵀ.
template <int R>
bool lora_backward_fixed(const Tensor& dy, const Tensor& x, const Tensor& h, const Tensor& dx, const Tensor& at_,
                         const Tensor& bt, const Tensor& da, const Tensor& db, int64_t real) {
  if (bt.size(1) != R) return false;
  const int64_t k = x.size(1), n = dy.size(1);
  std::vector<float> dh(real * R);
  auto run = [&](auto* dyp, auto* xp, auto* dxp) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(dyp)>>;
    Thin<T, R>::xm(dyp, n, bt.data_ptr<float>(), real, dh.data());
    Thin<T, R>::htd(h.data_ptr<float>(), dyp, n, real, db.data_ptr<float>());
    Thin<T, R>::xtg(xp, k, dh.data(), real, da.data_ptr<float>());
    Thin<T, R>::add_hm(dxp, k, dh.data(), at_.data_ptr<float>(), real);
  };
  if (dy.scalar_type() == at::kBFloat16)
    run(dy.data_ptr<c10::BFloat16>(), x.data_ptr<c10::BFloat16>(), dx.data_ptr<c10::BFloat16>());
  else
    run(dy.data_ptr<float>(), x.data_ptr<float>(), dx.data_ptr<float>());
  return true;
}

void lora_forward(const Tensor& x, const Tensor& y, const Tensor& a, const Tensor& b, const Tensor& h, int64_t real) {
  if (lora_forward_fixed<16>(x, y, a, b, h, real) ||
      lora_forward_fixed<32>(x, y, a, b, h, real) || lora_forward_fixed<64>(x, y, a, b, h, real))
    return;
  into(h, x.to(at::kFloat), a);  // another rank: fp32 products (MKL)
  y.add_(at::mm(h, b));
}

void lora_backward(const Tensor& dy, const Tensor& x, const Tensor& h, const Tensor& dx, const Tensor& a,
                   const Tensor& at_, const Tensor& bt, const Tensor& da, const Tensor& db, int64_t real) {
  if (lora_backward_fixed<16>(dy, x, h, dx, at_, bt, da, db, real) ||
      lora_backward_fixed<32>(dy, x, h, dx, at_, bt, da, db, real) ||
      lora_backward_fixed<64>(dy, x, h, dx, at_, bt, da, db, real))
    return;
  auto dyf = dy.to(at::kFloat);
  auto dh = at::mm(dyf, bt);
  into(db, h.t(), dyf);
  into(da, x.to(at::kFloat).t(), dh);
  dx.add_(at::mm(dh, a.t()));
}

// One projection's LoRA factors in fp32.
struct Factors {
  bool on = false;
  int64_t r = 0;
  Tensor a, b, at_, bt;  // (E, k, r), (E, r, n) and each transposed, contiguous
  Factors(const Tensor& a_, const Tensor& b_) {
    if (a_.numel() == 0) return;
    on = true;
    r = a_.size(2);
    a = a_.to(at::kFloat).contiguous();
    b = b_.to(at::kFloat).contiguous();
    at_ = a.transpose(1, 2).contiguous();
    bt = b.transpose(1, 2).contiguous();
  }
};

}  // namespace

// The experts' outputs in (token, slot) order, (T·k, H), and what backward reads: the gathered rows x (R, H), the
// gate_up outputs (R, 2I), and LoRA's x·A of each projection (R, r) in fp32 (empty without LoRA). `slot` lists the
// (token, slot) pairs sorted by expert, `counts` each expert's pairs. wgu (E, H, 2I), wd (E, I, H) any strides;
// a1 (E, H, r), b1 (E, r, 2I) with its scale folded in, a2 (E, I, r), b2 (E, r, H); empty a1 / a2: no LoRA there.
std::vector<Tensor> experts_forward(const Tensor& hidden, const Tensor& slot, const Tensor& counts, const Tensor& wgu,
                                    const Tensor& wd, const Tensor& a1, const Tensor& b1, const Tensor& a2,
                                    const Tensor& b2, int64_t top_k) {
  at::NoGradGuard no_grad;
  Plan p = plan(counts);
  auto hs = hidden.contiguous();
  auto sl = slot.contiguous();
  const int64_t* index = sl.data_ptr<int64_t>();
  Factors f1(a1, b1), f2(a2, b2);
  const int64_t hid = hs.size(1);
  auto fopt = hs.options().dtype(at::kFloat);
  auto x = at::empty({p.rrows, hid}, hs.options());
  auto gu = at::empty({p.rrows, wgu.size(2)}, hs.options());
  auto h1 = at::empty({f1.on ? p.rrows : 0, f1.r}, fopt);
  auto h2 = at::empty({f2.on ? p.rrows : 0, f2.r}, fopt);
  auto out = at::empty({sl.numel(), wd.size(2)}, hs.options());
    each_expert(p, [&](int64_t e) {
      const int64_t n = p.count[e], r = rounded(n);
      auto xe = rows(x, p, e), gue = rows(gu, p, e);
      gather(xe, hs, index + p.start[e], n, top_k);
      into(gue, xe, wgu[e]);
      if (f1.on) lora_forward(xe, gue, f1.a[e], f1.b[e], rows(h1, p, e), n);
      auto act = gate(gue);
      auto down = at::mm(act, wd[e]);
      if (f2.on) lora_forward(act, down, f2.a[e], f2.b[e], rows(h2, p, e), n);
      scatter(out, down, index + p.start[e], n);
  });
  return {out, x, gu, h1, h2};
}

// Gradients of experts_forward for dout (T·k, H): d hidden (T, H), d wgu, d wd (empty unless `weights`), d a1, d b1,
// d a2, d b2 in the factors' dtypes (the b's with respect to the scaled b's given; empty without LoRA there).
std::vector<Tensor> experts_backward(const Tensor& dout, const Tensor& slot, const Tensor& counts, const Tensor& wgu,
                                     const Tensor& wd, const Tensor& a1, const Tensor& b1, const Tensor& a2,
                                     const Tensor& b2, const Tensor& x, const Tensor& gu, const Tensor& h1,
                                     const Tensor& h2, int64_t top_k, bool weights) {
  at::NoGradGuard no_grad;
  Plan p = plan(counts);
  auto dy = dout.contiguous();
  auto sl = slot.contiguous();
  const int64_t* index = sl.data_ptr<int64_t>();
  Factors f1(a1, b1), f2(a2, b2);
  const int64_t num = counts.numel(), hid = x.size(1);
  auto dslot = at::empty({sl.numel(), hid}, dy.options());
  auto fopt = dy.options().dtype(at::kFloat);
  auto z = [&](const Tensor& like, bool on) { return on ? at::zeros(like.sizes(), fopt) : at::empty({0}, fopt); };
  auto da1 = z(f1.a, f1.on), db1 = z(f1.b, f1.on), da2 = z(f2.a, f2.on), db2 = z(f2.b, f2.on);
  auto dwgu = weights ? at::zeros({num, wgu.size(1), wgu.size(2)}, dy.options()) : at::empty({0}, dy.options());
  auto dwd = weights ? at::zeros({num, wd.size(1), wd.size(2)}, dy.options()) : at::empty({0}, dy.options());
    each_expert(p, [&](int64_t e) {
      const int64_t n = p.count[e], r = rounded(n);
      auto dd = at::empty({r, hid}, dy.options());
      gather(dd, dy, index + p.start[e], n, 1);
      auto xe = rows(x, p, e), gue = rows(gu, p, e);
      const int64_t half = gue.size(1) / 2;
      auto g = gue.narrow(1, 0, half), u = gue.narrow(1, half, half);
      auto sg = at::silu(g);
      auto act = at::mul(sg, u);
      auto dact = at::mm(dd, wd[e].t());
      if (f2.on) lora_backward(dd, act, rows(h2, p, e), dact, f2.a[e], f2.at_[e], f2.bt[e], da2[e], db2[e], n);
      if (weights) into(dwd[e], act.t(), dd);
      auto dgu = at::empty_like(gue);
      auto dg = dgu.narrow(1, 0, half), du = dgu.narrow(1, half, half);
      at::mul_out(du, dact, sg);
      at::silu_backward_out(dg, at::mul(dact, u), g);
      auto dx = at::mm(dgu, wgu[e].t());
      if (f1.on) lora_backward(dgu, xe, rows(h1, p, e), dx, f1.a[e], f1.at_[e], f1.bt[e], da1[e], db1[e], n);
      if (weights) into(dwgu[e], xe.t(), dgu);
      scatter(dslot, dx, index + p.start[e], n);
  });
  auto dh = dslot.view({-1, top_k, hid}).sum(1);
  auto as = [](const Tensor& g, const Tensor& like) { return g.numel() ? g.to(like.scalar_type()) : g; };
  return {dh, dwgu, dwd, as(da1, a1), as(db1, b1), as(da2, a2), as(db2, b2)};
}

TORCH_LIBRARY(tunelab_moe, m) {
  m.def("experts_forward", &experts_forward);
  m.def("experts_backward", &experts_backward);
}
