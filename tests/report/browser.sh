#!/usr/bin/env bash
# OUT/report.html of a real 2-rank quickstart run (app/report.hpp) opened from
# disk in headless Chromium: the page renders, every sample image loads (the
# page's own check sets data-images / data-broken on <body>), and the browser
# logs no console error. Negative control: the same page with one image link
# broken must be caught by both checks. SKIPPED (exit 77) without chromium.
#   bash tests/report/browser.sh DITRL MPIEXEC_AND_ARGS WORK_DIR
set -euo pipefail
ditrl=$1 mpiexec=$2 work=$3
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $browser ]]; then
  echo "SKIPPED: no chromium (Debian package chromium; scripts/deps.sh installs it)"
  exit 77
fi
deck=$(cd "$(dirname "$0")/../.." && pwd)/inputs/quickstart.toml
rm -rf "$work" && mkdir -p "$work"
out=$work/run
# shellcheck disable=SC2086  # MPIEXEC_AND_ARGS is a command line
timeout 600 $mpiexec -np 2 "$ditrl" train "$deck" --set run.out_dir="$out" --set train.num_rollouts=2 \
  --set log.samples_every=1 --set log.samples=4 > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }

# Renders the page; prints its DOM, leaves the browser's log in $2.
render() {
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --user-data-dir="$work/profile" \
    --allow-file-access-from-files --enable-logging=stderr --v=0 --virtual-time-budget=5000 --dump-dom \
    "file://$1" 2> "$2"
}
# The console errors Chromium logs ("CONSOLE" lines at level ERROR / uncaught).
console_errors() { grep -E 'CONSOLE.*(ERROR|Uncaught)|Uncaught|"error"' "$1" || true; }

fail=0
dom=$(render "$out/report.html" "$work/browser.log")
grep -q '<h1>quickstart</h1>' <<< "$dom" || { echo "FAIL: the page did not render its title"; fail=1; }
grep -q 'data-images="3"' <<< "$dom" || { echo "FAIL: expected 3 sample images (rollouts 0 1 2)"; fail=1; }
grep -q 'data-broken="0"' <<< "$dom" || { echo "FAIL: an image did not load"; fail=1; }
grep -q '<svg' <<< "$dom" || { echo "FAIL: no curve"; fail=1; }
errors=$(console_errors "$work/browser.log")
[[ -z $errors ]] || { echo "FAIL: console errors:"; echo "$errors"; fail=1; }

# Negative control: one broken link, seen by the page and in the console.
sed 's|samples/rollout-000001.png|samples/missing.png|' "$out/report.html" > "$out/broken.html"
dom=$(render "$out/broken.html" "$work/broken.log")
grep -q 'data-broken="1"' <<< "$dom" || { echo "FAIL: the negative control's broken image went unseen"; fail=1; }
grep -q 'image did not load: samples/missing.png' "$work/broken.log" ||
  { echo "FAIL: the negative control's console error was not logged"; fail=1; }
((fail == 0)) && echo "report: renders, 3 images load, no console errors; a broken image is caught"
exit $fail
