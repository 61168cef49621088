# The rdma fake-fabric C test (included from CMakeLists.txt inside its
# BUILD_TESTING block): GPU memory over rdma between two processes through
# te.h, on the fake libibverbs and CUDA driver built here from the sources
# the Go tests compile (make fakes builds the same into build/fake). The
# fake libibverbs needs verbs.h (libibverbs-dev); without it the test is
# left out.
if(EXISTS /usr/include/infiniband/verbs.h)
  add_library(te_fake_verbs SHARED internal/sys/ibv/ibvtest/testdata/fakeverbs.c)
  add_library(te_fake_cuda SHARED internal/sys/cuda/cudatest/testdata/fakecuda.c)
  set_target_properties(te_fake_verbs PROPERTIES OUTPUT_NAME ibverbs)
  set_target_properties(te_fake_cuda PROPERTIES OUTPUT_NAME cuda)
  foreach(f te_fake_verbs te_fake_cuda)
    set_target_properties(${f} PROPERTIES SOVERSION 1 C_STANDARD 11
      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fake)
    target_compile_options(${f} PRIVATE -Wall -Werror)
    target_link_libraries(${f} PRIVATE Threads::Threads)
  endforeach()
  # Calls inside the library stay inside it (ibvtest.Build does the same).
  target_link_options(te_fake_verbs PRIVATE -Wl,-Bsymbolic)

  add_executable(te_rdma_fabric tests/c/rdma_fabric.c)
  target_link_libraries(te_rdma_fabric PRIVATE te::te Threads::Threads ${CMAKE_DL_LIBS})
  target_compile_definitions(te_rdma_fabric PRIVATE _GNU_SOURCE)
  target_compile_options(te_rdma_fabric PRIVATE -Wall -Wextra -Werror)
  set_target_properties(te_rdma_fabric PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON)
  add_dependencies(te_rdma_fabric te_fake_verbs te_fake_cuda)
  add_test(NAME c_rdma_fabric
    COMMAND te_rdma_fabric ${CMAKE_CURRENT_SOURCE_DIR}/internal/sys/topo/testdata/hgx8.tree)
  set_tests_properties(c_rdma_fabric PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77
    ENVIRONMENT "TE_IBV_LIBRARY=$<TARGET_FILE:te_fake_verbs>;TE_CUDA_LIBRARY=$<TARGET_FILE:te_fake_cuda>")
else()
  message(STATUS "verbs.h not found: the rdma fake-fabric test is left out (apt-get install libibverbs-dev)")
endif()
