# Shared build settings and the dsv4_layer() helper.

set(DSV4_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter -Wno-missing-field-initializers)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC 12 reports false -Wrestrict / -Wstringop-overflow positives inside std::string and
  # std::vector at -O2 (GCC bugs 105329, 106199).
  list(APPEND DSV4_WARNINGS -Wno-restrict -Wno-stringop-overflow)
endif()
if(DSV4_WERROR)
  list(APPEND DSV4_WARNINGS -Werror)
endif()

# Test binaries (dsv4_test) compile at -O1 in every build: their sources are GoogleTest, JSON and HTTP
# templates around calls into the libraries, whose kernels keep the build's optimisation, so -O1 costs their
# run time little and saves a third of their compile time (test_server_streaming.cpp 20.6 s at -O3, 13.8 s at
# -O1), which is most of CI's three builds.
set(DSV4_TEST_OPT -O1)
set(DSV4_SAN_FLAGS "")
set(DSV4_SAN_TOOL_OPT "")
if(DSV4_SANITIZE)
  set(DSV4_SAN_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:${DSV4_SAN_FLAGS}>")
  add_link_options(${DSV4_SAN_FLAGS})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC documents that -fsanitize=address makes -Wmaybe-uninitialized report false
    # positives; GCC 12 does so inside <regex> and <functional> (std::function moves).
    list(APPEND DSV4_WARNINGS -Wno-maybe-uninitialized)
  endif()
  # The dsv4 tool at -O1 too (tools/), like the test binaries: the sanitized build's CLI tests run it, and its
  # sources are command-line and JSON glue (cmd_run.cpp, cmd_serve.cpp) around the libraries (-O2).
  set(DSV4_SAN_TOOL_OPT -O1)
endif()

if(DSV4_TSAN)
  # ThreadSanitizer for the threaded layers (runtime, server, thread pool, expert streaming): not with
  # DSV4_SANITIZE or DSV4_FUZZ (ASan and TSan cannot share a process).
  if(DSV4_SANITIZE OR DSV4_FUZZ)
    message(FATAL_ERROR "DSV4_TSAN=ON cannot be combined with DSV4_SANITIZE or DSV4_FUZZ (AddressSanitizer)")
  endif()
  set(DSV4_SAN_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:${DSV4_SAN_FLAGS}>")
  add_link_options(${DSV4_SAN_FLAGS})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12 with -fsanitize=thread reports false -Warray-bounds / -Wstringop-overread inside
    # std::vector::insert.
    list(APPEND DSV4_WARNINGS -Wno-array-bounds -Wno-stringop-overread)
  endif()
endif()

if(DSV4_FUZZ)
  # Coverage instrumentation for everything the fuzz targets call; the targets
  # themselves add -fsanitize=fuzzer at link (tests/fuzz/CMakeLists.txt).
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DSV4_FUZZ=ON needs clang (-DCMAKE_CXX_COMPILER=clang++)")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=fuzzer-no-link,address,undefined>)
  add_link_options(-fsanitize=address,undefined)
endif()

set(DSV4_LAYER_ROOT ${CMAKE_BINARY_DIR}/layers)

# dsv4_layer(<name> FOLDER <src-subfolder> SOURCES ... DEPS <layer targets> LIBS <other libs>)
# Creates static library dsv4_<name>. Its include root holds links to its own
# folder and to the folders of its direct dependencies; dependencies' roots
# propagate (PUBLIC), so the visible set is exactly the transitive closure.
function(dsv4_layer name)
  cmake_parse_arguments(L "" "FOLDER" "SOURCES;DEPS;LIBS" ${ARGN})
  set(target dsv4_${name})
  add_library(${target} STATIC ${L_SOURCES})
  set(root ${DSV4_LAYER_ROOT}/${name})
  set(folders ${L_FOLDER})
  foreach(dep ${L_DEPS})
    get_target_property(dep_folder ${dep} DSV4_FOLDER)
    list(APPEND folders ${dep_folder})
  endforeach()
  foreach(f ${folders})
    get_filename_component(parent ${root}/${f} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    if(NOT EXISTS ${root}/${f})
      file(CREATE_LINK ${CMAKE_SOURCE_DIR}/src/${f} ${root}/${f} SYMBOLIC)
    endif()
  endforeach()
  set_target_properties(${target} PROPERTIES DSV4_FOLDER ${L_FOLDER})
  target_include_directories(${target} PUBLIC ${root})
  target_link_libraries(${target} PUBLIC ${L_DEPS} ${L_LIBS})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${DSV4_WARNINGS}>)
endfunction()

define_property(TARGET PROPERTY DSV4_FOLDER BRIEF_DOCS "src/ folder of a dsv4 layer" FULL_DOCS "src/ folder of a dsv4 layer")
