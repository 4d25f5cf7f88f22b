# Runs `dgc bench exchange` on a small gradient and checks its JSON line:
#   cmake -DDGC=path/to/dgc -DMODE=local|torchrun [-DEXTRA="opt;..."] -P exchange_check.cmake
# local: 2 worker threads in one process; torchrun: 2 processes over 127.0.0.1 (one pipeline, so
# both run at once; rank 0 is last so its output is the one captured).
cmake_minimum_required(VERSION 3.22)

set(numel 100000)
set(args bench exchange --numel ${numel} --json --repeats 3 --untimed-iterations 1 --timeout 30
    ${EXTRA})
if(MODE STREQUAL "local")
  execute_process(COMMAND ${DGC} ${args} --workers 2
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status TIMEOUT 150)
elseif(MODE STREQUAL "torchrun")
  # A random port; another attempt on a new one only if this one was taken.
  foreach(attempt RANGE 1 3)
    string(RANDOM LENGTH 4 ALPHABET 0123456789 port)
    math(EXPR port "20000 + ${port}")
    set(env MASTER_ADDR=127.0.0.1 MASTER_PORT=${port} WORLD_SIZE=2)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env ${env} RANK=1 ${DGC} ${args}
                    COMMAND ${CMAKE_COMMAND} -E env ${env} RANK=0 ${DGC} ${args}
                    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULTS_VARIABLE statuses TIMEOUT 50)
    set(status 0)
    foreach(s IN LISTS statuses)
      if(NOT s STREQUAL "0")
        set(status "${statuses}")
      endif()
    endforeach()
    if(status STREQUAL "0" OR NOT err MATCHES "already in use")
      break()
    endif()
    message(STATUS "port ${port} was taken, trying another")
  endforeach()
else()
  message(FATAL_ERROR "MODE must be local or torchrun, got '${MODE}'")
endif()

if(NOT status STREQUAL "0")
  message(FATAL_ERROR "dgc bench exchange failed (${status}):\n${out}\n${err}")
endif()
string(REGEX MATCH "{[^\n]*}" line "${out}")
if(NOT line)
  message(FATAL_ERROR "no JSON line in the output:\n${out}\n${err}")
endif()
message(STATUS "${line}")

function(expect field expected)
  string(JSON value ERROR_VARIABLE error GET "${line}" ${field})
  if(error)
    message(FATAL_ERROR "field '${field}' missing: ${error}")
  endif()
  if(NOT "${value}" STREQUAL "${expected}")
    message(FATAL_ERROR "field '${field}': expected ${expected}, found ${value}")
  endif()
endfunction()
expect(verified ON)
expect(dense_verified ON)
expect(backend gloo)
expect(launch ${MODE})
expect(workers 2)
expect(numel ${numel})
expect(selected_per_rank 100)

# The phases the Exchange reports are present and add up to no more than the whole.
string(JSON dgc_s GET "${line}" dgc_seconds)
foreach(phase encode collective validate decode)
  string(JSON value ERROR_VARIABLE error GET "${line}" phases ${phase}_seconds)
  if(error OR value LESS 0)
    message(FATAL_ERROR "phase '${phase}' missing or negative: '${value}' ${error}")
  endif()
endforeach()
string(JSON algorithm GET "${line}" algorithm)
if(NOT algorithm MATCHES "^(allgather|direct|sparse-allreduce)$")
  message(FATAL_ERROR "algorithm '${algorithm}' is not one the exchange runs")
endif()

# Numbers that must be present and positive; DGC must send far fewer bytes than dense.
foreach(field density dgc_seconds dense_seconds wire_bytes_sent_per_rank
              wire_bytes_received_per_rank dense_wire_bytes_per_rank message_bytes
              dense_gradient_bytes compression_ratio)
  string(JSON value ERROR_VARIABLE error GET "${line}" ${field})
  if(error OR NOT value GREATER 0)
    message(FATAL_ERROR "field '${field}' missing or not positive: '${value}' ${error}")
  endif()
endforeach()
string(JSON sent GET "${line}" wire_bytes_sent_per_rank)
string(JSON dense GET "${line}" dense_wire_bytes_per_rank)
math(EXPR limit "${dense} / 50")
if(NOT sent LESS limit)
  message(FATAL_ERROR "DGC sent ${sent} B per rank, dense ${dense} B: expected under 1/50 of it")
endif()
