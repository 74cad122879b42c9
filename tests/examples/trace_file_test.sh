#!/usr/bin/env bash
# train_gpt --trace writes a Chrome trace of one step: every begin event has its end (same lane,
# same name, properly nested), time never goes back, the peak instant is the largest per-op peak
# and no counter sample exceeds it, and a checkpointed step shows replay ops and segments.
set -euo pipefail
train_gpt=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
small=(--layers 3 --width 32 --heads 2 --context 16 --batch 4 --steps 3 --eval-every 3 --eval-batches 1 --sample 0 --json --save "")
"$train_gpt" "${small[@]}" --checkpoint none --trace none.json > none.out
"$train_gpt" "${small[@]}" --checkpoint every --trace every.json > every.out
python3 - none.json every.json <<'PY'
import json, sys
for path in sys.argv[1:]:
    events = json.load(open(path))["traceEvents"]
    stacks, last_ts, ends, counters, peaks, cats = {}, -1.0, [], [], [], set()
    for e in events:
        if e["ph"] == "M":
            continue
        if e["ph"] != "i":  # the peak instant comes last, stamped at its op's end
            assert e["ts"] >= last_ts, f"{path}: time goes back at {e}"
            last_ts = e["ts"]
        if e["ph"] == "B":
            stacks.setdefault(e["tid"], []).append(e["name"])
            cats.add(e["cat"])
        elif e["ph"] == "E":
            stack = stacks.get(e["tid"], [])
            assert stack and stack[-1] == e["name"], f"{path}: end {e['name']} does not match {stack[-1:]}"
            stack.pop()
            ends.append(e["args"]["peak_bytes"])
        elif e["ph"] == "C":
            counters.append(e["args"]["live"])
        elif e["ph"] == "i":
            peaks.append(e["args"]["peak_bytes"])
            assert e["ts"] <= last_ts, f"{path}: peak stamped after the last event"
    assert all(not s for s in stacks.values()), f"{path}: events left open: {stacks}"
    assert len(peaks) == 1 and peaks[0] == max(ends), f"{path}: peak {peaks} is not the largest op peak {max(ends)}"
    assert counters and max(counters) <= peaks[0] and min(counters) > 0, f"{path}: counter outside (0, peak]"
    want = {"forward", "backward"} | ({"replay", "segment"} if "every" in path else set())
    assert want <= cats, f"{path}: phases {cats}, expected {want}"
    assert "every" in path or "replay" not in cats, f"{path}: replay without checkpointing"
    print(f"{path}: {len(ends)} events, peak {peaks[0]} bytes, phases {sorted(cats)}")
PY
