#!/bin/sh
# The binary frames format with curl --data-binary. Each frame is
#   u32 little-endian byte length | UTF-8 text | u64 little-endian user id
# built here with printf's octal escapes. Usage: sh examples/frames.sh [BASE_URL]
set -eu
URL=${1:-http://127.0.0.1:8000}
BODY=$(mktemp)
trap 'rm -f "$BODY"' EXIT

# frame TEXT ID: append one frame (ID below 256 for this sketch; the full field is 8 bytes).
frame() {
  length=$(printf '%s' "$1" | wc -c)
  printf "\\$(printf '%03o' $((length % 256)))\\$(printf '%03o' $((length / 256 % 256)))\\000\\000" >>"$BODY"
  printf '%s' "$1" >>"$BODY"
  printf "\\$(printf '%03o' "$2")\\000\\000\\000\\000\\000\\000\\000" >>"$BODY"
}
frame "A warm, funny and beautifully acted film." 7
frame "Two hours I will never get back." 42

# The answer is JSON keyed by user id: {"model": ..., "results": {"7": {...}, "42": {...}}}
curl -sf "$URL/v1/classify" -H 'content-type: application/x-glassbox-frames' --data-binary @"$BODY"
echo
