#pragma once
// A scatter plot written as SVG by hand: enough for the benchmarks' figures, no dependency.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace bench {

struct Series {
  std::string name;
  std::string color;
  bool hollow = false;
  std::vector<double> x, y;
  std::vector<std::string> labels;  // next to each point (may be empty)
};

/// A "nice" step for about `ticks` ticks over [lo, hi].
inline double tick_step(double lo, double hi, int ticks) {
  const double raw = (hi - lo) / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10 * mag;
}

inline std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

/// Writes a scatter plot of `series` to `path`: x linear from 0, y logarithmic (decades).
inline bool write_scatter_svg(const std::string& path, const std::string& title, const std::string& x_label,
                              const std::string& y_label, const std::vector<Series>& series) {
  double xmax = 0, ymin = 1e300, ymax = 0;
  for (const Series& s : series) {
    for (double v : s.x) xmax = std::max(xmax, v);
    for (double v : s.y) ymin = std::min(ymin, v), ymax = std::max(ymax, v);
  }
  if (xmax <= 0) xmax = 1;
  if (!(ymin > 0) || ymin > ymax) ymin = 0.1, ymax = std::max(ymax, 1.0);
  const double xs = tick_step(0, xmax * 1.05, 6);
  xmax = std::ceil(xmax * 1.05 / xs) * xs;
  const double d0 = std::floor(std::log10(ymin)), d1 = std::ceil(std::log10(ymax * 1.01));
  const double W = 760, H = 480, L = 80, R = 200, T = 50, B = 60;
  const auto px = [&](double v) { return L + v / xmax * (W - L - R); };
  const auto py = [&](double v) { return H - B - (std::log10(v) - d0) / (d1 - d0) * (H - T - B); };
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  std::fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
  std::fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  std::fprintf(f, "<text x=\"%.0f\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">%s</text>\n", (L + W - R) / 2, escape(title).c_str());
  for (double v = 0; v <= xmax + 1e-9; v += xs) {
    std::fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", px(v), H - B, px(v), T);
    std::fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", px(v), H - B + 18, v);
  }
  const double ybottom = std::pow(10.0, d0), ytop = std::pow(10.0, d1);
  for (double d = d0; d <= d1 + 1e-9; ++d) {
    const double v = std::pow(10.0, d);
    std::fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", px(0), py(v), px(xmax), py(v));
    std::fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", px(0) - 6, py(v) + 4, v);
  }
  std::fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", px(0), py(ybottom), px(xmax), py(ybottom));
  std::fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", px(0), py(ybottom), px(0), py(ytop));
  std::fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n", (L + W - R) / 2, H - 16, escape(x_label).c_str());
  std::fprintf(f, "<text x=\"18\" y=\"%.0f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.0f)\">%s</text>\n", (T + H - B) / 2,
               (T + H - B) / 2, escape(y_label).c_str());
  double legend_y = T + 10;
  for (const Series& s : series) {
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      std::fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\" stroke=\"%s\" stroke-width=\"2\"/>\n", px(s.x[i]), py(s.y[i]),
                   s.hollow ? "none" : s.color.c_str(), s.color.c_str());
      if (i < s.labels.size() && !s.labels[i].empty()) {
        std::fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#333\">%s</text>\n", px(s.x[i]) + 8, py(s.y[i]) - 6,
                     escape(s.labels[i]).c_str());
      }
    }
    std::fprintf(f, "<circle cx=\"%.0f\" cy=\"%.0f\" r=\"5\" fill=\"%s\" stroke=\"%s\" stroke-width=\"2\"/>\n", W - R + 20, legend_y,
                 s.hollow ? "none" : s.color.c_str(), s.color.c_str());
    std::fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", W - R + 32, legend_y + 4, escape(s.name).c_str());
    legend_y += 20;
  }
  std::fprintf(f, "</svg>\n");
  return std::fclose(f) == 0;
}

}  // namespace bench
