# The kvcache and handoff C tests (included from CMakeLists.txt inside its
# BUILD_TESTING block): tests/c/kvcache.c needs only libte; tests/c/handoff.c
# runs a real te-sidecar, built here with the Go toolchain.
# TE_PREBUILT_SIDECAR: a te-sidecar built elsewhere (make passes its own).
set(TE_PREBUILT_SIDECAR "" CACHE FILEPATH "A te-sidecar built elsewhere, for the handoff test")
if(TE_PREBUILT_SIDECAR)
  set(TE_SIDECAR_FILE ${TE_PREBUILT_SIDECAR})
  add_custom_target(te_sidecar_for_tests)
else()
  if(NOT GO_EXECUTABLE)
    message(FATAL_ERROR "the handoff test needs te-sidecar: install Go or set TE_PREBUILT_SIDECAR")
  endif()
  set(TE_SIDECAR_FILE ${CMAKE_CURRENT_BINARY_DIR}/te-sidecar)
  file(GLOB_RECURSE TE_SIDECAR_SOURCES CONFIGURE_DEPENDS
       ${CMAKE_CURRENT_SOURCE_DIR}/cmd/te-sidecar/*.go
       ${CMAKE_CURRENT_SOURCE_DIR}/internal/*.go
       ${CMAKE_CURRENT_SOURCE_DIR}/engine/*.go
       ${CMAKE_CURRENT_SOURCE_DIR}/kvcache/*.go)
  list(FILTER TE_SIDECAR_SOURCES EXCLUDE REGEX "_test\\.go$")
  add_custom_command(
    OUTPUT ${TE_SIDECAR_FILE}
    COMMAND ${GO_EXECUTABLE} build "-tags=${TE_GO_TAGS}" -o ${TE_SIDECAR_FILE} ./cmd/te-sidecar
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
    DEPENDS ${TE_SIDECAR_SOURCES} ${CMAKE_CURRENT_SOURCE_DIR}/go.mod ${CMAKE_CURRENT_SOURCE_DIR}/go.sum
    COMMENT "Building te-sidecar for the handoff test"
    VERBATIM)
  add_custom_target(te_sidecar_for_tests ALL DEPENDS ${TE_SIDECAR_FILE})
endif()

foreach(t kvcache handoff)
  add_executable(te_${t} tests/c/${t}.c)
  target_link_libraries(te_${t} PRIVATE te::te Threads::Threads)
  target_compile_definitions(te_${t} PRIVATE _GNU_SOURCE)
  target_compile_options(te_${t} PRIVATE -Wall -Wextra -Werror)
  set_target_properties(te_${t} PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON)
endforeach()
add_dependencies(te_handoff te_sidecar_for_tests)
add_test(NAME c_kvcache COMMAND te_kvcache)
add_test(NAME c_handoff COMMAND te_handoff ${TE_SIDECAR_FILE})
add_test(NAME c_handoff_tcp COMMAND te_handoff ${TE_SIDECAR_FILE} tcp)
set_tests_properties(c_kvcache PROPERTIES TIMEOUT 120)
set_tests_properties(c_handoff c_handoff_tcp PROPERTIES TIMEOUT 300)
