# ctest c_header_*: te.h compiles without a warning as C and as C++ under the
# strictest flags a user is likely to build with (included from
# CMakeLists.txt inside its BUILD_TESTING block). The C++ check needs a C++
# compiler (g++ from .ci/deps.d/capi.pkgs).
set(TE_HEADER_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror)
foreach(std c99 c11)
  add_test(NAME c_header_${std}
    COMMAND ${CMAKE_C_COMPILER} -std=${std} ${TE_HEADER_WARNINGS} -fsyntax-only
            -I${CMAKE_CURRENT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/tests/c/header_check.c)
endforeach()
include(CheckLanguage)
check_language(CXX)
if(CMAKE_CXX_COMPILER)
  foreach(std c++11 c++17)
    add_test(NAME c_header_${std}
      COMMAND ${CMAKE_CXX_COMPILER} -x c++ -std=${std} ${TE_HEADER_WARNINGS} -Wold-style-cast -fsyntax-only
              -I${CMAKE_CURRENT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/tests/c/header_check.c)
  endforeach()
else()
  message(WARNING "no C++ compiler: te.h is not checked as C++ (install g++)")
endif()
