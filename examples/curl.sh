#!/bin/sh
# The API with curl: a response, a streamed one, a follow-up, and the stored response.
#   sh examples/curl.sh               # against `make serve` at http://127.0.0.1:8000/v1
# OPENAI_BASE_URL and MODEL change the server and the model; with API keys in the server's
# config (auth.keys), set OPENAI_API_KEY.
set -eu
BASE=${OPENAI_BASE_URL:-http://127.0.0.1:8000/v1}
MODEL=${MODEL:-gpt-oss-replay}
AUTH="Authorization: Bearer ${OPENAI_API_KEY:-unused}"

curl -sS "$BASE/models" -H "$AUTH"
echo

# Not streamed: the Response object.
response=$(curl -sS "$BASE/responses" -H "$AUTH" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"input\": \"Hello, world!\"}")
echo "$response"
id=$(printf '%s' "$response" | sed -n 's/^{"id":"\([^"]*\)".*/\1/p')

# Streamed: server-sent events, response.created ... response.completed.
curl -sS -N "$BASE/responses" -H "$AUTH" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"input\": \"Stream me.\", \"stream\": true}"

# A follow-up of the stored response, then the stored response itself.
curl -sS "$BASE/responses" -H "$AUTH" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"input\": \"And again.\", \"previous_response_id\": \"$id\"}"
echo
curl -sS "$BASE/responses/$id" -H "$AUTH"
echo
