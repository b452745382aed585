#!/usr/bin/env bash
# expect_failure.sh MODE TEST_DIST MPIRUN...: runs test_dist with 3 ranks in failure mode MODE
# (throw: rank 1 throws; die: rank 1 exits without a word; disagree: rank 1 has another
# configuration) and passes when the whole job ends non-zero within 30 s, with the message that
# names the problem when there is one.
set -u
mode=$1 binary=$2
shift 2
start=$SECONDS
out=$(TIGHTFIT_DIST_FAILURE=$mode timeout 30 "$@" -np 3 "$binary" 2>&1)
rc=$?
took=$((SECONDS - start))
if [ $rc -eq 0 ]; then echo "FAIL: mode $mode: the job exited 0"; echo "$out"; exit 1; fi
if [ $rc -eq 124 ]; then echo "FAIL: mode $mode: the job still ran after 30 s (hang)"; exit 1; fi
case $mode in
  throw) want="rank 1 failed on purpose" ;;
  disagree) want="ranks disagree on the model configuration" ;;
  *) want="" ;;
esac
if [ -n "$want" ] && ! grep -q "$want" <<<"$out"; then
  echo "FAIL: mode $mode: exit $rc but no line saying '$want':"; echo "$out"; exit 1
fi
echo "mode $mode: the job ended with exit $rc after $took s"
