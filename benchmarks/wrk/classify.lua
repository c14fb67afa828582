-- wrk script: POST /v1/classify with one text per request, cycling through a file of JSON bodies (one per line).
-- usage: wrk -s benchmarks/wrk/classify.lua URL -- BODIES_FILE
local bodies = {}
local next_body = 0

function init(args)
  for line in io.lines(args[1]) do
    bodies[#bodies + 1] = line
  end
  -- each wrk thread starts at a different place in the mix
  next_body = math.random(#bodies)
end

function request()
  next_body = next_body % #bodies + 1
  return wrk.format("POST", "/v1/classify", { ["Content-Type"] = "application/json" }, bodies[next_body])
end
