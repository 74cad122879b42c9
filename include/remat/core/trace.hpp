#pragma once
/// @file
/// Trace: a memory timeline of a training step. While a Trace lives, every op its thread's tapes
/// run (forward, checkpoint replay, backward) is recorded with its start and end time, the bytes
/// live after it and the highest count reached while it ran; checkpoint segments are recorded as
/// spans. save_chrome_json() writes the Chrome trace event format, which Perfetto
/// (ui.perfetto.dev) and chrome://tracing open:
///
///     remat::Trace trace;                 // records this thread's ops from here
///     { remat::Tape tape; ...; tape.backward(loss); }
///     trace.save_chrome_json("step.json");
///
/// When no Trace is alive an op pays one thread-local pointer test.
///
/// Note [trace peak]: the allocator keeps one process-wide peak. To learn the peak inside each
/// op, a span lowers that peak to the live count when the op starts and, when it ends, reads
/// the op's own peak and raises the process peak back to the larger of the two. The process
/// peak therefore means what it always meant, and memory::Probe around a traced step reads the
/// same figure as without a trace.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/core/memory.hpp"

namespace remat {

/// What part of a step an event belongs to.
enum class TracePhase : std::uint8_t { forward, replay, backward, segment };

inline const char* trace_phase_name(TracePhase p) noexcept {
  switch (p) {
    case TracePhase::forward:
      return "forward";
    case TracePhase::replay:
      return "replay";
    case TracePhase::backward:
      return "backward";
    case TracePhase::segment:
      return "segment";
  }
  return "?";
}

/// One op run (or one checkpoint segment, for TracePhase::segment).
struct TraceEvent {
  TracePhase phase;
  std::string name;        ///< the op's name ("matmul"), or "segment <id>"
  std::uint32_t node = 0;  ///< node id on the tape (segment id for segments)
  double begin_us = 0;     ///< microseconds since the Trace started
  double end_us = 0;
  std::size_t live_after = 0;  ///< bytes live when it ended
  std::size_t peak = 0;        ///< most bytes live while it ran
};

class Trace;

namespace detail {

inline Trace*& active_trace() noexcept {
  thread_local Trace* trace = nullptr;
  return trace;
}

}  // namespace detail

/// Records the ops of this thread's tapes while it lives (one Trace per thread at a time).
class Trace {
 public:
  Trace() : start_(std::chrono::steady_clock::now()), live_at_start_(memory::live_bytes()) {
    if (detail::active_trace() != nullptr) {
      throw UsageError("Trace: a trace is already recording on this thread; traces do not nest");
    }
    detail::active_trace() = this;
  }
  ~Trace() { stop(); }
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  /// Stops recording (the destructor does it too); the events stay readable.
  void stop() noexcept {
    if (detail::active_trace() == this) detail::active_trace() = nullptr;
  }

  /// Events in the order they ended (an op ends before its enclosing segment).
  const std::vector<TraceEvent>& events() const noexcept { return events_; }

  /// Most bytes live during any recorded event.
  std::size_t peak_bytes() const noexcept {
    std::size_t peak = 0;
    for (const TraceEvent& e : events_) peak = std::max(peak, e.peak);
    return peak;
  }
  /// Bytes live when the trace started.
  std::size_t live_at_start() const noexcept { return live_at_start_; }

  /// Writes the Chrome trace event format: begin/end events for ops (one lane per phase) and
  /// segments, a counter track "live bytes", and an instant event at the peak.
  void write_chrome_json(std::ostream& out) const;

  /// write_chrome_json() to a file; an IoError names the file when it cannot be written.
  void save_chrome_json(const std::string& path) const {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    if (file) write_chrome_json(file);
    file.flush();
    if (!file) throw IoError(detail::cat("Trace::save_chrome_json: cannot write '", path, "'"));
  }

  // ---- for the tape (internal) ---------------------------------------------------------------

  /// Starts an event; returns its slot for end().
  std::size_t begin(TracePhase phase, std::string name, std::uint32_t node) {
    TraceEvent e{phase, std::move(name), node, now_us(), 0, 0, 0};
    open_.push_back(Open{std::move(e), memory::peak_bytes()});
    memory::reset_peak();  // Note [trace peak]
    return open_.size() - 1;
  }

  /// Ends the event begun in `slot`. Events end in the reverse order they began; those left
  /// open above `slot` (by an exception) are dropped.
  void end(std::size_t slot) {
    if (slot >= open_.size()) return;
    open_.resize(slot + 1);
    Open o = std::move(open_.back());
    open_.pop_back();
    o.event.end_us = now_us();
    o.event.live_after = memory::live_bytes();
    o.event.peak = memory::peak_bytes();
    // Note [trace peak]. For a nested event, outer_peak is its parent's peak so far, so this
    // also hands the parent the highest count reached inside this event.
    raise_peak(o.outer_peak);
    events_.push_back(std::move(o.event));
  }

  /// Whether this trace is the one recording on the calling thread.
  bool recording() const noexcept { return detail::active_trace() == this; }

 private:
  struct Open {
    TraceEvent event;
    std::size_t outer_peak;  // the process peak (or the enclosing event's) before this began
  };

  double now_us() const noexcept {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
        .count();
  }

  static void raise_peak(std::size_t to) noexcept {
    std::atomic<std::size_t>& peak = detail::memory_counters().peak;
    std::size_t seen = peak.load(std::memory_order_relaxed);
    while (to > seen && !peak.compare_exchange_weak(seen, to, std::memory_order_relaxed)) {
    }
  }

  std::chrono::steady_clock::time_point start_;
  std::size_t live_at_start_;
  std::vector<Open> open_;
  std::vector<TraceEvent> events_;
};

namespace detail {

/// Writes s as a JSON string literal.
inline void write_json_string(std::ostream& out, const std::string& s) {
  out << '"';
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out << '\\' << c;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out << buf;
    } else {
      out << c;
    }
  }
  out << '"';
}

/// Records one op or segment on the thread's active trace, if any (RAII).
class TraceSpan {
 public:
  TraceSpan(TracePhase phase, const char* name, std::uint32_t node) : trace_(active_trace()) {
    if (trace_) slot_ = trace_->begin(phase, name, node);
  }
  /// A span for checkpoint segment `id`: "segment <id>" (forward) or "replay segment <id>".
  TraceSpan(bool replay, std::uint32_t id) : trace_(active_trace()) {
    if (trace_)
      slot_ =
          trace_->begin(TracePhase::segment, cat(replay ? "replay segment " : "segment ", id), id);
  }
  ~TraceSpan() {
    if (trace_ && trace_->recording()) trace_->end(slot_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Trace* trace_;
  std::size_t slot_ = 0;
};

}  // namespace detail

inline void Trace::write_chrome_json(std::ostream& out) const {
  // Lanes (Chrome "threads"): 1 segments, 2 forward, 3 replay, 4 backward.
  const auto lane = [](TracePhase p) {
    switch (p) {
      case TracePhase::segment:
        return 1;
      case TracePhase::forward:
        return 2;
      case TracePhase::replay:
        return 3;
      case TracePhase::backward:
        return 4;
    }
    return 0;
  };
  // Begin and end records sorted by time; at equal times ends first, then begins, so that
  // back-to-back spans do not overlap. An event begins after its enclosing one begins and
  // ends before it ends, by construction.
  struct Mark {
    double ts;
    int kind;  // 0 end, 1 begin
    std::size_t index;
  };
  std::vector<Mark> marks;
  marks.reserve(events_.size() * 2);
  for (std::size_t i = 0; i < events_.size(); ++i) {
    marks.push_back(Mark{events_[i].begin_us, 1, i});
    marks.push_back(Mark{events_[i].end_us, 0, i});
  }
  std::stable_sort(marks.begin(), marks.end(), [&](const Mark& a, const Mark& b) {
    if (a.ts != b.ts) return a.ts < b.ts;
    if (a.kind != b.kind) return a.kind < b.kind;
    // Among begins at one time, the longer (enclosing) span first; among ends, the shorter.
    const double da = events_[a.index].end_us - events_[a.index].begin_us;
    const double db = events_[b.index].end_us - events_[b.index].begin_us;
    return a.kind == 1 ? da > db : da < db;
  });
  std::size_t peak_index = events_.size();
  for (std::size_t i = 0; i < events_.size(); ++i) {
    if (peak_index == events_.size() || events_[i].peak > events_[peak_index].peak) peak_index = i;
  }

  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  out << R"({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "remat step"}})";
  for (int l = 1; l <= 4; ++l) {
    static const char* const names[] = {"", "checkpoint segments", "forward", "replay", "backward"};
    out << ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": " << l
        << R"(, "args": {"name": ")" << names[l] << "\"}}";
  }
  char ts[32];
  const auto stamp = [&](double us) {
    std::snprintf(ts, sizeof ts, "%.3f", us);
    return ts;
  };
  for (const Mark& m : marks) {
    const TraceEvent& e = events_[m.index];
    out << ",\n{\"name\": ";
    detail::write_json_string(out, e.name);
    out << ", \"cat\": \"" << trace_phase_name(e.phase) << "\", \"ph\": \""
        << (m.kind == 1 ? 'B' : 'E') << "\", \"ts\": " << stamp(m.ts)
        << ", \"pid\": 1, \"tid\": " << lane(e.phase);
    if (m.kind == 0) {
      out << ", \"args\": {\"node\": " << e.node << ", \"live_bytes\": " << e.live_after
          << ", \"peak_bytes\": " << e.peak << "}";
    }
    out << "}";
    if (m.kind == 0) {
      out << ",\n{\"name\": \"live bytes\", \"ph\": \"C\", \"ts\": " << stamp(m.ts)
          << ", \"pid\": 1, \"args\": {\"live\": " << e.live_after << "}}";
    }
  }
  if (peak_index < events_.size()) {
    const TraceEvent& e = events_[peak_index];
    out << ",\n{\"name\": \"peak\", \"ph\": \"i\", \"s\": \"g\", \"ts\": " << stamp(e.end_us)
        << ", \"pid\": 1, \"tid\": " << lane(e.phase) << ", \"args\": {\"peak_bytes\": " << e.peak
        << ", \"during\": ";
    detail::write_json_string(out, e.name);
    out << "}}";
  }
  out << "\n]}\n";
}

}  // namespace remat
