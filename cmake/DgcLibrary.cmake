# dgc_add_library(NAME core SOURCES a.cc ... PUBLIC_LIBS ... PRIVATE_LIBS ...)
# Defines target dgc_<NAME>, alias dgc::<NAME>, exported as dgc::<NAME>.
function(dgc_add_library)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;PUBLIC_LIBS;PRIVATE_LIBS" ${ARGN})
  set(target dgc_${ARG_NAME})
  add_library(${target} ${ARG_SOURCES})
  add_library(dgc::${ARG_NAME} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${ARG_NAME})
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} PUBLIC ${ARG_PUBLIC_LIBS}
                        PRIVATE ${ARG_PRIVATE_LIBS} $<BUILD_INTERFACE:dgc_build_flags>)
  install(TARGETS ${target} EXPORT dgcTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()

# dgc_torch_pch(TARGET [SKIP a.cc ...]), after dgc_train_step is defined
# The translation units of TARGET read <torch/torch.h> from one precompiled header,
# dgc_train_step's (the lowest libtorch library: the Python module reuses it without dgc_train)
# (made once, 40-55 s; trainer.cc alone compiles in 12 s instead of 28 s, and the whole main
# build took 845 CPU-s instead of 1,000 on 2 cores). SKIP: TARGET's sources that do not include
# libtorch; loading the 600 MB header would cost them several seconds. GCC uses a precompiled
# header only under the -fpic/-fpie setting it was made with: executables and modules are
# compiled with -fPIC like the libraries (-Winvalid-pch says so if a setting ever differs; GCC
# then reads the header itself, slower but correct). DGC_PRECOMPILE_TORCH=OFF turns it off.
function(dgc_torch_pch target)
  cmake_parse_arguments(ARG "" "" "SKIP" ${ARGN})
  if(NOT DGC_PRECOMPILE_TORCH)
    return()
  endif()
  if(target STREQUAL "dgc_train_step")
    target_precompile_headers(dgc_train_step PRIVATE <torch/torch.h>)
  else()
    target_precompile_headers(${target} REUSE_FROM dgc_train_step)
  endif()
  target_compile_options(${target} PRIVATE -fPIC -Winvalid-pch)
  if(ARG_SKIP)
    set_source_files_properties(${ARG_SKIP} TARGET_DIRECTORY ${target}
                                PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()
