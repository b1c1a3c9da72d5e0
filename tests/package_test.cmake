# The installed package as an outside project uses it (ctest runs this script; tests/CMakeLists.txt):
# cmake --install of the build into WORK/prefix, examples/ configured on its own with
# find_package(regen) against that prefix, built, and the U-Net example run. Any failing step fails
# the test with its output.
foreach(v BUILD SOURCE WORK CXX BUILD_TYPE)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "package_test.cmake needs -D${v}=...")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()
step("install" ${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix)
foreach(f include/regen/remat/execute/pipeline.h include/regen/session/session.h
          include/regen/core/tensor.h lib/cmake/regen/regenConfig.cmake lib/cmake/regen/regenTargets.cmake
          lib/cmake/regen/RegenExtension.cmake)
  if(NOT EXISTS ${WORK}/prefix/${f})
    message(FATAL_ERROR "the installed package has no ${f}")
  endif()
endforeach()
# Nothing of the source tree may be needed: the examples see only the prefix.
step("configure examples/" ${CMAKE_COMMAND} -S ${SOURCE}/examples -B ${WORK}/examples
     -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
step("build examples/" ${CMAKE_COMMAND} --build ${WORK}/examples)
step("run unet" ${WORK}/examples/unet)
message(STATUS "${last_output}")
# The command line with the U-Net registered: profile, plan and train through the tool's own code.
step("unet-tool train" ${WORK}/examples/unet-tool train --model unet --batch 8 --steps 3
     --policy dp --budget 70% --budget-of allocated --progress none)
message(STATUS "${last_output}")
if(NOT last_output MATCHES "remat dp: predicted peak allocated [^;]*; measured [^(]*\\(exact on (the one step|every one of the [0-9]+ steps) under the plan\\)")
  message(FATAL_ERROR "unet-tool train did not report an exact prediction:\n${last_output}")
endif()
# The U-Net's own options and checks on the command line, named by their flags.
execute_process(COMMAND ${WORK}/examples/unet-tool train --model unet --levels 3 --image-size 36
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--image-size 36 is not a multiple of 8, as the U-Net's --levels 3")
  message(FATAL_ERROR "unet-tool did not refuse --image-size 36 at --levels 3 (${rc}):\n${err}")
endif()
message(STATUS "unet-tool refuses --image-size 36 at --levels 3: ok")
# The Python module from the prefix alone (when the build has one): import it, profile, plan and
# train a step under the plan.
if(PYTHON AND PYTHON_DIR)
  if(NOT EXISTS ${WORK}/prefix/${PYTHON_DIR})
    message(FATAL_ERROR "the installed package has no ${PYTHON_DIR}")
  endif()
  set(env PYTHONPATH=${WORK}/prefix/${PYTHON_DIR})
  if(PYTHON_PRELOAD)  # a sanitizer build: its runtime first (tests/CMakeLists.txt)
    list(APPEND env LD_PRELOAD=${PYTHON_PRELOAD} ASAN_OPTIONS=detect_leaks=0)
  endif()
  step("python: import regen from the prefix" ${CMAKE_COMMAND} -E env ${env}
       ${PYTHON} -c "import regen, sys; assert regen.__file__.startswith(sys.argv[1]), regen.__file__; m = regen.Model('resnet-tiny', batch=8, device='cpu', image_size=128); p = m.profile(iterations=1); plan = m.plan('mutwo', '60%', budget_of='allocated'); assert plan.feasible and plan.recomputed > 0, plan; r = m.step(); assert (r.peak_allocated, r.peak_reserved) == (plan.peak_allocated, plan.peak_reserved), (r, plan); print('installed module', regen.__file__, plan)"
       ${WORK}/prefix)
  message(STATUS "${last_output}")
  # The C++ U-Net built as an extension against the installed headers (regen_add_extension), loaded
  # by the installed module, and the same U-Net from regen.ops: one copy of regen in the process.
  step("python: examples/python/unet.py with the installed module and the U-Net extension"
       ${CMAKE_COMMAND} -E env ${env} ${PYTHON} ${SOURCE}/examples/python/unet.py
       ${WORK}/examples/unet_extension.so --quick)
  message(STATUS "${last_output}")
endif()
