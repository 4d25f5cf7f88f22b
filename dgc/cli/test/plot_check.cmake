# dgc plot on committed sample JSON lines (real outputs of `dgc train --metrics` for a 3-epoch run
# on 3000 examples, dense and DGC, of `dgc bench exchange --json` for 2-4 workers and of
# `dgc bench step --model cnn --json` for 2 and 4 workers): every
# chart is written as a real PNG and an SVG with the expected title and legend; bad input fails
# with a message that names the problem.
# dgc.jsonl and exchange.jsonl use today's keys (message_bytes, dense_gradient_bytes,
# wire_bytes_sent_per_rank, ...); dense.jsonl and step.jsonl keep the keys written before the
# rename (bytes_sent, dense_bytes, bytes_sent_per_rank, ...), as files on disk still have them:
# the message bytes of both training runs must reach the bytes chart.
#   cmake -DDGC=path/to/dgc -DDATA=dir/with/samples -DOUT=scratch/dir -P plot_check.cmake
file(REMOVE_RECURSE "${OUT}")

execute_process(
  COMMAND "${DGC}" plot "${DATA}/dense.jsonl" "${DATA}/dgc.jsonl" "${DATA}/exchange.jsonl"
          "${DATA}/step.jsonl" --out "${OUT}" --title "sample run"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dgc plot failed (${rc}):\n${out}\n${err}")
endif()

# chart file -> texts its SVG must contain
set(charts
  "dgc-test_accuracy-epoch|sample run: test accuracy (%) by epoch|dense|DGC|epoch"
  "dgc-test_accuracy-time|sample run: test accuracy (%) by wall time|wall time (minutes)|DGC"
  "dgc-bytes|sample run: message bytes per worker per epoch|message bytes per worker (MB)|DGC"
  "dgc-exchange-time|sample run: exchange time per iteration|DGC, loopback|dense allreduce, loopback|workers"
  "dgc-exchange-speedup|sample run: speedup of the DGC exchange over a dense allreduce|dense time / DGC time"
  "dgc-step-time|sample run: time per training step (replayed: compute + optimizer step)|DGC, loopback, cnn|dense, loopback, cnn"
  "dgc-step-speedup|sample run: speedup of DGC training steps over dense|loopback, cnn|dense time / DGC time")
foreach(chart IN LISTS charts)
  string(REPLACE "|" ";" parts "${chart}")
  list(POP_FRONT parts name)
  set(png "${OUT}/${name}.png")
  set(svg "${OUT}/${name}.svg")
  if(NOT EXISTS "${png}" OR NOT EXISTS "${svg}")
    message(FATAL_ERROR "${name}: PNG or SVG missing; dgc plot printed:\n${out}")
  endif()
  file(READ "${png}" magic LIMIT 8 HEX)
  if(NOT magic STREQUAL "89504e470d0a1a0a")
    message(FATAL_ERROR "${png} is not a PNG (starts with ${magic})")
  endif()
  file(SIZE "${png}" png_size)
  if(png_size LESS 2000)
    message(FATAL_ERROR "${png} is only ${png_size} bytes")
  endif()
  file(READ "${svg}" svg_text)
  if(NOT svg_text MATCHES "<svg")
    message(FATAL_ERROR "${svg} is not an SVG")
  endif()
  foreach(text IN LISTS parts)
    string(FIND "${svg_text}" "${text}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${svg} lacks the text '${text}'")
    endif()
  endforeach()
endforeach()

# The message bytes (MB, 4th column of each run's datablock) of epoch 1 of both runs: dense.jsonl's
# from "bytes_sent" (the old key), dgc.jsonl's from "message_bytes"; a key not read leaves 0.
file(READ "${OUT}/dgc.gp" script)
foreach(run_bytes "0|39.7258|dense.jsonl, old key bytes_sent" "1|4.19179|dgc.jsonl, key message_bytes")
  string(REPLACE "|" ";" parts "${run_bytes}")
  list(GET parts 0 run)
  list(GET parts 1 megabytes)
  list(GET parts 2 what)
  if(NOT script MATCHES "\\$run${run} << EOD\n1 [^\n]* ${megabytes}\n")
    message(FATAL_ERROR "dgc.gp: run ${run} (${what}) lacks ${megabytes} MB in epoch 1:\n${script}")
  endif()
endforeach()

# --target: a dashed reference line on both metric charts, in % for accuracy.
execute_process(
  COMMAND "${DGC}" plot "${DATA}/dense.jsonl" "${DATA}/dgc.jsonl" --out "${OUT}/target"
          --target 0.8125 --target-label "the reference level"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dgc plot --target failed (${rc}):\n${out}\n${err}")
endif()
foreach(name dgc-test_accuracy-epoch dgc-test_accuracy-time)
  file(READ "${OUT}/target/${name}.svg" svg_text)
  string(FIND "${svg_text}" "the reference level" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${name}.svg lacks the --target line's label")
  endif()
endforeach()
file(READ "${OUT}/target/dgc.gp" script)
string(FIND "${script}" ", 81.25 with lines dt 2" at)
if(at EQUAL -1)
  message(FATAL_ERROR "dgc.gp does not draw the target at 81.25 (%):\n${script}")
endif()

# Bad input: a clear error, non-zero exit.
function(expect_failure expected)
  execute_process(COMMAND "${DGC}" plot ${ARGN} --out "${OUT}/bad"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "dgc plot ${ARGN} succeeded; expected an error containing '${expected}'")
  endif()
  string(FIND "${err}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "dgc plot ${ARGN}: expected '${expected}' in the error, got:\n${err}")
  endif()
endfunction()
expect_failure("malformed.jsonl:2: not a JSON object" "${DATA}/malformed.jsonl")
expect_failure("--label given 1 times for 2 files" "${DATA}/dense.jsonl" "${DATA}/dgc.jsonl"
               --label only-one)
file(WRITE "${OUT}/no_metric.jsonl" "{\"epoch\":1,\"seconds\":2.5,\"train_loss\":1.0}\n")
expect_failure("no test_accuracy, test_perplexity, validation_perplexity or test_token_error_rate"
               "${OUT}/no_metric.jsonl")
expect_failure("field 'no_such_field' is missing" "${DATA}/dense.jsonl" --metric no_such_field)
