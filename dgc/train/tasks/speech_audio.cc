// The audio side of the speech corpus (speech_corpus.h): reading espeak-ng's WAV output, the
// log-mel features, and the noise of the noisy test set.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "dgc/core/error.h"
#include "dgc/train/tasks/speech_corpus.h"
#include "dgc/train/tasks/speech_corpus_internal.h"

namespace dgc::train::speech {

std::vector<float> parse_wav(const std::string& bytes, const std::string& what) {
  const auto bad = [&](const std::string& why) {
    return DataError("espeak-ng's output " + what + " is not a 16-bit mono " +
                     std::to_string(kSampleRate) + " Hz WAV file (" + why + "): " + kInstall);
  };
  const auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int k = 3; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(bytes[at + k]);
    return v;
  };
  const auto u16 = [&](size_t at) {
    return static_cast<uint16_t>(static_cast<uint8_t>(bytes[at]) |
                                 (static_cast<uint8_t>(bytes[at + 1]) << 8));
  };
  if (bytes.size() < 12 || bytes.compare(0, 4, "RIFF") != 0 || bytes.compare(8, 4, "WAVE") != 0) {
    throw bad("no RIFF/WAVE header");
  }
  bool format_seen = false;
  size_t at = 12;
  while (at + 8 <= bytes.size()) {
    const std::string id = bytes.substr(at, 4);
    const size_t size = u32(at + 4);
    const size_t body = at + 8;
    if (id == "fmt ") {
      if (size < 16 || body + 16 > bytes.size()) throw bad("short fmt chunk");
      if (u16(body) != 1 || u16(body + 2) != 1 || u32(body + 4) != kSampleRate ||
          u16(body + 14) != 16) {
        throw bad("format " + std::to_string(u16(body)) + ", " + std::to_string(u16(body + 2)) +
                  " channels, " + std::to_string(u32(body + 4)) + " Hz, " +
                  std::to_string(u16(body + 14)) + " bits");
      }
      format_seen = true;
    } else if (id == "data") {
      if (!format_seen) throw bad("data before fmt");
      // A streamed file may carry a placeholder size: take what is there.
      const size_t n = std::min(size, bytes.size() - body) / 2;
      std::vector<float> samples(n);
      for (size_t i = 0; i < n; ++i) {
        samples[i] = static_cast<float>(static_cast<int16_t>(u16(body + 2 * i))) / 32768.0f;
      }
      return samples;
    }
    at = body + size + (size & 1);
  }
  throw bad("no data chunk");
}

torch::Tensor power_spectrum(const torch::Tensor& samples) {
  DGC_CHECK(samples.dim() == 1, "power_spectrum takes a 1-D waveform");
  if (samples.size(0) < kWindow) return torch::zeros({0, kWindow / 2 + 1});
  const auto window = torch::hann_window(kWindow, /*periodic=*/true, torch::kFloat32);
  const auto spectrum = torch::stft(samples.to(torch::kFloat32), kWindow, kHop, kWindow, window,
                                    /*normalized=*/false, /*onesided=*/true,
                                    /*return_complex=*/true);  // [bins, frames], no centering
  return spectrum.abs().pow(2).t().contiguous();
}

namespace {
double hz_to_mel(double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); }
double mel_to_hz(double mel) { return 700.0 * (std::pow(10.0, mel / 2595.0) - 1.0); }
}  // namespace

double mel_band_center_hz(int64_t band) {
  const double low = hz_to_mel(kMelLow);
  const double high = hz_to_mel(kMelHigh);
  return mel_to_hz(low + (high - low) * static_cast<double>(band + 1) / (kBands + 1));
}

torch::Tensor mel_filterbank() {
  const int64_t bins = kWindow / 2 + 1;
  auto bank = torch::zeros({kBands, bins}, torch::kFloat32);
  auto a = bank.accessor<float, 2>();
  for (int64_t b = 0; b < kBands; ++b) {
    const double left = b == 0 ? kMelLow : mel_band_center_hz(b - 1);
    const double center = mel_band_center_hz(b);
    const double right = b + 1 == kBands ? kMelHigh : mel_band_center_hz(b + 1);
    for (int64_t k = 0; k < bins; ++k) {
      const double hz = static_cast<double>(k) * kSampleRate / kWindow;
      double w = 0.0;
      if (hz > left && hz <= center) w = (hz - left) / (center - left);
      if (hz > center && hz < right) w = (right - hz) / (right - center);
      a[b][k] = static_cast<float>(w);
    }
  }
  return bank;
}

torch::Tensor log_mel(const torch::Tensor& samples) {
  static const torch::Tensor bank = mel_filterbank();
  return torch::log(torch::mm(power_spectrum(samples), bank.t()) + 1e-6);
}

torch::Tensor normalise(const torch::Tensor& features) {
  if (features.size(0) == 0) return features;
  const auto mean = features.mean(0, /*keepdim=*/true);
  const auto std = features.std(0, /*unbiased=*/false, /*keepdim=*/true);
  return ((features - mean) / (std + 1e-5)).contiguous();
}

torch::Tensor log_mel_features(const torch::Tensor& samples) { return normalise(log_mel(samples)); }

torch::Tensor add_noise(const torch::Tensor& samples, double snr_db, uint64_t seed) {
  auto out = samples.to(torch::kFloat32).contiguous().clone();
  float* x = out.data_ptr<float>();
  const int64_t n = out.numel();
  double power = 0.0;
  for (int64_t i = 0; i < n; ++i) power += static_cast<double>(x[i]) * x[i];
  power = n > 0 ? power / static_cast<double>(n) : 0.0;
  const double sigma = std::sqrt(power / std::pow(10.0, snr_db / 10.0));
  Stream s{seed};
  for (int64_t i = 0; i < n; i += 2) {
    // Box-Muller: two normal draws from two uniforms.
    const double u1 = 1.0 - s.uniform();
    const double u2 = s.uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    x[i] += static_cast<float>(sigma * r * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) x[i + 1] += static_cast<float>(sigma * r * std::sin(2.0 * M_PI * u2));
  }
  return out;
}

}  // namespace dgc::train::speech
