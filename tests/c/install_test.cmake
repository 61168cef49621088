# ctest c_install_consumer: install the build into a scratch prefix, then
# build and run a consumer through find_package(te) and through pkg-config.
# Inputs: TE_BUILD_DIR, TE_SOURCE_DIR, GENERATOR, TE_VERSION (the package
# version, major.minor.patch, from te.h).
set(prefix ${TE_BUILD_DIR}/install-test)
set(work ${TE_BUILD_DIR}/install-test-work)
file(REMOVE_RECURSE ${prefix} ${work})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${ARGN}\nfailed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

run(${CMAKE_COMMAND} --install ${TE_BUILD_DIR} --prefix ${prefix})
file(GLOB_RECURSE pcs ${prefix}/*/te.pc)
file(GLOB_RECURSE cfgs ${prefix}/*/te-config.cmake)
if(NOT pcs OR NOT cfgs OR NOT EXISTS ${prefix}/include/te.h)
  message(FATAL_ERROR "install is missing te.pc, te-config.cmake or te.h")
endif()

# find_package(te major.minor) of the installed version works ...
string(REGEX MATCH "^[0-9]+\\.[0-9]+" want "${TE_VERSION}")
string(REGEX MATCH "^[0-9]+" major "${TE_VERSION}")
string(REGEX REPLACE "^[0-9]+\\.([0-9]+).*" "\\1" minor "${TE_VERSION}")
math(EXPR newer "${minor} + 1")
run(${CMAKE_COMMAND} -S ${TE_SOURCE_DIR}/tests/c/consumer -B ${work}/cmake -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DTE_WANT=${want})
run(${CMAKE_COMMAND} --build ${work}/cmake)
run(${work}/cmake/consumer)
# ... and a newer minor is refused: the version file is real.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${TE_SOURCE_DIR}/tests/c/consumer -B ${work}/cmake-newer -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DTE_WANT=${major}.${newer} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(rc EQUAL 0)
  message(FATAL_ERROR "find_package(te ${major}.${newer}) accepted te ${TE_VERSION}")
endif()

# pkg-config te
find_program(PKG_CONFIG pkg-config)
find_program(CC NAMES cc gcc)
if(PKG_CONFIG AND CC)
  list(GET pcs 0 pc)
  get_filename_component(pcdir ${pc} DIRECTORY)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pcdir} ${PKG_CONFIG} --cflags --libs te
    OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config te failed")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pcdir} ${PKG_CONFIG} --atleast-version=${want} te
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config --atleast-version=${want} te failed")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pcdir} ${PKG_CONFIG} --atleast-version=${major}.${newer} te
    RESULT_VARIABLE rc)
  if(rc EQUAL 0)
    message(FATAL_ERROR "pkg-config --atleast-version=${major}.${newer} te accepted te ${TE_VERSION}")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  foreach(f ${flags})
    if(f MATCHES "^-L(.*)")
      set(libdir ${CMAKE_MATCH_1})
    endif()
  endforeach()
  run(${CC} ${TE_SOURCE_DIR}/tests/c/consumer/main.c -o ${work}/consumer-pc ${flags} -Wl,-rpath,${libdir})
  run(${work}/consumer-pc)
else()
  message(STATUS "pkg-config or cc missing: pkg-config consumer not tested")
endif()
