#!/usr/bin/env bash
# The mutation check (README, "Testing"): each one-line bug below, applied to the code under test, must make the
# named test fail; the file is restored after each. Run from the project root: bash tests/mutations/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider -x)
S=workflow/scripts/qwen3_pilot
# file | the line as it is | the line with the bug | the test that must fail
MUTATIONS=(
  "$S/titan/kernels/rope.py|    return torch.cat((-x2, x1), dim=-1)|    return torch.cat((x2, -x1), dim=-1)|tests/titan/test_rope.py::test_rope_hf_rotates_each_first_half_second_half_pair_by_hand"
  "$S/backends/cpu.py|    return 2 * size**3 * calls / elapsed|    return 20 * size**3 * calls / elapsed|tests/backends/test_backends.py::test_cpu_peak_measurement_agrees_with_a_matmul_timed_here"
  "$S/stages/train_judging.py|    if not control - loaded >= gate[\"min_gap\"]:|    if not control - loaded >= 0:|tests/test_training.py::test_the_loaded_weights_gate_holds_the_gap_to_training_gate_min_gap"
  "$S/plots.py|            curves[plain] = [(s[\"step\"], s[\"loss_plain\"]) for s in replacements[\"against_plain\"][\"steps\"]]|            curves[plain] = [(s[\"step\"], s[\"loss_replaced\"]) for s in replacements[\"against_plain\"][\"steps\"]]|tests/test_plots.py::test_the_loss_plot_draws_each_curve_from_its_own_losses_and_each_pair_difference"
  "$S/stage_run.py|            check_custody(self.consumes)|            pass  # custody check skipped|tests/test_stage_run.py::test_a_stage_whose_input_changed_after_its_producer_recorded_it_fails_before_its_work"
)
status=0
for mutation in "${MUTATIONS[@]}"; do
    IFS='|' read -r file line bug test <<<"$mutation"
    # A test that fails on the code as it is catches nothing.
    if ! "${PYTEST[@]}" "$test" >/dev/null 2>&1; then
        echo "BROKEN:   $test fails without the mutation"; status=1; continue
    fi
    cp "$file" "$file.orig"
    python3 - "$file" "$line" "$bug" <<'PY' || { echo "MUTATION NOT APPLIED: $file: line not found"; status=1; mv "$file.orig" "$file"; continue; }
import sys
path, line, bug = sys.argv[1:]
text = open(path).read()
assert text.count(line + "\n") == 1, "the line must occur once"
open(path, "w").write(text.replace(line + "\n", bug + "\n"))
PY
    if "${PYTEST[@]}" "$test" >/dev/null 2>&1; then
        echo "SURVIVED: $file: '${bug## }' ($test passed)"; status=1
    else
        echo "caught:   $file: '${bug## }' -> $test failed"
    fi
    mv "$file.orig" "$file"
done
exit $status
