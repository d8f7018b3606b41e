# The JVM half: the JNI library (jni/), the Java classes (spark-glue/java) compiled against
# the jars of the installed pyspark package, the final jar carrying the native files, and
# the JUnit run (tests/java). Included from the top CMakeLists.txt; everything here is
# optional: without javac or without the pyspark jars the C build goes on alone.

set(TSP_JAR_ARCH_DIR org/torchspark/native/linux-x86_64)

if(TSP_SANITIZE OR TSP_SANITIZE_THREAD)
  # A sanitized .so cannot be loaded into a plain `java` (the runtime must come first).
  message(STATUS "torchspark: JVM part skipped in sanitizer builds")
  return()
endif()

find_package(Java 17 COMPONENTS Development QUIET)
if(NOT Java_JAVAC_EXECUTABLE)
  message(STATUS "torchspark: JVM part skipped: no javac 17+ found (install openjdk-17-jdk-headless)")
  return()
endif()

# The jars of the installed pyspark package: TSP_PYSPARK_JARS, else ask the checkout's
# .venv python (or TSP_PYTHON) where pyspark lives.
if(NOT TSP_PYSPARK_JARS)
  set(_tsp_py "${TSP_PYTHON}")
  if(NOT _tsp_py AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(_tsp_py "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  endif()
  if(_tsp_py)
    execute_process(
      COMMAND "${_tsp_py}" -c "import pyspark,os;print(os.path.join(os.path.dirname(pyspark.__file__),'jars'))"
      OUTPUT_VARIABLE _tsp_jars OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _tsp_rc)
    if(_tsp_rc EQUAL 0 AND IS_DIRECTORY "${_tsp_jars}")
      set(TSP_PYSPARK_JARS "${_tsp_jars}" CACHE PATH "the jars directory of the pyspark package")
    endif()
  endif()
endif()
if(NOT TSP_PYSPARK_JARS OR NOT IS_DIRECTORY "${TSP_PYSPARK_JARS}")
  message(STATUS "torchspark: JVM part skipped: the pyspark package's jars were not found "
                 "(run tests/setup.sh, or pass -DTSP_PYSPARK_JARS=<pyspark>/jars)")
  return()
endif()

# Debian has no default-java without default-jdk and FindJNI knows no java-17 path there:
# JAVA_HOME from javac's real path (.../java-17-openjdk-amd64/bin/javac).
if(NOT DEFINED ENV{JAVA_HOME} AND NOT JAVA_HOME)
  file(REAL_PATH "${Java_JAVAC_EXECUTABLE}" _tsp_javac)
  cmake_path(GET _tsp_javac PARENT_PATH _tsp_bin)
  cmake_path(GET _tsp_bin PARENT_PATH JAVA_HOME)
endif()
# The headless JDK has no AWT: ask for the JVM component only.
find_package(JNI COMPONENTS JVM QUIET)
if(NOT JNI_FOUND AND NOT JAVA_INCLUDE_PATH)
  message(STATUS "torchspark: JVM part skipped: JNI headers not found under ${JAVA_HOME}")
  return()
endif()
message(STATUS "torchspark: JVM part on, against ${TSP_PYSPARK_JARS}")
include(UseJava)

file(GLOB TSP_SPARK_JARS CONFIGURE_DEPENDS "${TSP_PYSPARK_JARS}/*.jar")
file(GLOB_RECURSE TSP_JAVA_SOURCES CONFIGURE_DEPENDS
  "${PROJECT_SOURCE_DIR}/spark-glue/java/org/torchspark/*.java")
# -path: the derby and scala-compiler jars name Class-Path entries that do not exist.
set(CMAKE_JAVA_COMPILE_FLAGS --release 17 -Xlint:all,-path -Werror -proc:none)

# The classes alone (and the javac -h header for jni/).
add_jar(torchspark_classes
  SOURCES ${TSP_JAVA_SOURCES}
  INCLUDE_JARS ${TSP_SPARK_JARS}
  GENERATE_NATIVE_HEADERS torchspark_classes-native DESTINATION "${CMAKE_BINARY_DIR}/jni-include"
  OUTPUT_DIR "${CMAKE_BINARY_DIR}/java")

# The JNI library: one thin file over the public C API; only Java_* and JNI_OnLoad exported.
add_library(torchspark_jni SHARED "${PROJECT_SOURCE_DIR}/jni/torchspark_jni.c")
target_link_libraries(torchspark_jni PRIVATE torchspark torchspark_classes-native)
target_include_directories(torchspark_jni PRIVATE ${JAVA_INCLUDE_PATH} ${JAVA_INCLUDE_PATH2})
target_compile_options(torchspark_jni PRIVATE ${TSP_WARNINGS})
target_compile_definitions(torchspark_jni PRIVATE _GNU_SOURCE)
target_link_options(torchspark_jni PRIVATE -Wl,--no-undefined -Wl,-z,now
  "-Wl,--version-script=${PROJECT_SOURCE_DIR}/jni/torchspark_jni.map")
set_target_properties(torchspark_jni PROPERTIES C_VISIBILITY_PRESET hidden
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib
  # Found next to it once extracted: libtorchspark.so sits in the same directory.
  BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH "$ORIGIN"
  LINK_DEPENDS "${PROJECT_SOURCE_DIR}/jni/torchspark_jni.map")

# One rule makes the final jar from the classes jar and the three native files, so no
# jar can come out without them (a Java-only change rebuilds it too).
set(TSP_JAR "${CMAKE_BINARY_DIR}/java/torchspark.jar")
set(_tsp_stage "${CMAKE_BINARY_DIR}/java/native-stage")
get_target_property(_tsp_classes_jar torchspark_classes JAR_FILE)
add_custom_command(OUTPUT "${TSP_JAR}"
  COMMAND ${CMAKE_COMMAND} -E rm -rf "${_tsp_stage}"
  COMMAND ${CMAKE_COMMAND} -E make_directory "${_tsp_stage}/${TSP_JAR_ARCH_DIR}"
  COMMAND ${CMAKE_COMMAND} -E copy $<TARGET_FILE:torchspark> $<TARGET_FILE:torchspark_jni>
          $<TARGET_FILE:torchspark-run> "${_tsp_stage}/${TSP_JAR_ARCH_DIR}/"
  COMMAND ${CMAKE_COMMAND} -E copy "${_tsp_classes_jar}" "${TSP_JAR}.tmp"
  COMMAND ${Java_JAR_EXECUTABLE} uf "${TSP_JAR}.tmp" -C "${_tsp_stage}" org
  COMMAND ${CMAKE_COMMAND} -E rename "${TSP_JAR}.tmp" "${TSP_JAR}"
  DEPENDS torchspark_classes "${_tsp_classes_jar}" torchspark torchspark_jni torchspark-run
  COMMENT "torchspark.jar: classes + native files for linux-x86_64"
  VERBATIM)
add_custom_target(torchspark_jar ALL DEPENDS "${TSP_JAR}")

# JUnit 4 from Debian's junit4 (hamcrest comes through its manifest's Class-Path).
set(TSP_JUNIT_JAR /usr/share/java/junit4.jar)
file(GLOB TSP_JAVA_TESTS CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/tests/java/org/torchspark/*.java")
if(TSP_BUILD_TESTS AND EXISTS "${TSP_JUNIT_JAR}" AND TSP_JAVA_TESTS)
  add_jar(torchspark_tests
    SOURCES ${TSP_JAVA_TESTS}
    INCLUDE_JARS torchspark_classes ${TSP_JUNIT_JAR} ${TSP_SPARK_JARS}
    OUTPUT_DIR "${CMAKE_BINARY_DIR}/java")
  add_dependencies(torchspark_tests torchspark_jar)
  get_target_property(_tsp_tests_jar torchspark_tests JAR_FILE)
  # The tests load the packed jar (the loader under test), then the test classes.
  add_test(NAME java_junit
    COMMAND ${Java_JAVA_EXECUTABLE} -Dtorchspark.test.build=${CMAKE_BINARY_DIR}
            -Dtorchspark.test.root=${PROJECT_SOURCE_DIR}
            -cp "${TSP_JAR}:${_tsp_tests_jar}:${TSP_JUNIT_JAR}:${TSP_PYSPARK_JARS}/*"
            org.torchspark.JUnitMain)
  set_tests_properties(java_junit PROPERTIES TIMEOUT 300)
elseif(TSP_BUILD_TESTS AND NOT EXISTS "${TSP_JUNIT_JAR}")
  message(STATUS "torchspark: JUnit tests skipped (no ${TSP_JUNIT_JAR}: apt-get install junit4)")
endif()
