#!/bin/sh
# glassbox's own JSON API and the TEI-compatible routes, with curl. Usage: sh examples/curl.sh [BASE_URL]
set -eu
URL=${1:-http://127.0.0.1:8000}

# Wait (up to a minute) until the model is loaded and warm.
i=0
until curl -sf "$URL/readyz" >/dev/null; do
  i=$((i + 1)); [ "$i" -le 60 ] || { echo "no ready glassbox at $URL" >&2; exit 1; }
  sleep 1
done

# glassbox's API: several texts, the two best labels of each. -f: an HTTP error fails the script.
curl -sf "$URL/v1/classify" -H 'content-type: application/json' \
     -d '{"texts": ["A warm, funny and beautifully acted film.", "Two hours I will never get back."], "top_k": 2}'
echo

# The stage timings of one request, from its headers.
curl -sf -o /dev/null -D - "$URL/v1/classify" -H 'content-type: application/json' -d '{"text": "An instant classic."}' \
  | grep -i -e '^x-request-id' -e '^x-latency-ms' -e '^server-timing'

# Hugging Face TEI's routes: /predict, and the base URL with a text pair.
curl -sf "$URL/predict" -H 'content-type: application/json' -d '{"inputs": "An instant classic."}'
echo
curl -sf "$URL/" -H 'content-type: application/json' -d '{"inputs": ["Was it good?", "An instant classic."]}'
echo
curl -sf "$URL/info"
echo
