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
