# cmake -DNM=nm -DOBJECTS="a.o|b.o" -DLIBRARY=libremat_instances.a -P check_instances.cmake
# Fails when a user object defines a function that remat_instances compiles, or when the
# library does not define them: the extern templates of remat/instances.hpp did not take effect.
set(instances
  "remat::detail::LinearNode<float>::forward("
  "remat::detail::LinearNode<float>::backward("
  "remat::detail::UnaryNode<float, remat::detail::GeluOp>::forward("
  "remat::detail::MseLossNode<float>::backward("
  "remat::optim::AdamW<float>::update("
  "remat::optim::Optimizer<float>::step()"
  "remat::nn::Linear<float>::Linear("
  "remat::Var<float> remat::detail::record<float>(")

function(defined_symbols file out)
  execute_process(COMMAND "${NM}" --defined-only -C "${file}" OUTPUT_VARIABLE symbols
    RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${NM} ${file} failed")
  endif()
  set(${out} "${symbols}" PARENT_SCOPE)
endfunction()

defined_symbols("${LIBRARY}" library_symbols)
foreach(symbol IN LISTS instances)
  string(FIND "${library_symbols}" "${symbol}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "remat_instances does not define ${symbol}")
  endif()
endforeach()
string(REPLACE "|" ";" OBJECTS "${OBJECTS}")  # joined with | to pass as one argument
# TARGET_OBJECTS lists the precompiled header's own .gch too: only the TUs' objects count
list(FILTER OBJECTS INCLUDE REGEX "\\.(o|obj)$")
list(LENGTH OBJECTS n)
if(n LESS 2)
  message(FATAL_ERROR "expected the objects of small_trainer.cpp and second_tu.cpp, got: ${OBJECTS}")
endif()
foreach(object IN LISTS OBJECTS)
  defined_symbols("${object}" object_symbols)
  foreach(symbol IN LISTS instances)
    string(FIND "${object_symbols}" "${symbol}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${object} instantiates ${symbol} itself")
    endif()
  endforeach()
endforeach()
message(STATUS "${n} objects: none defines the ${LIBRARY} instantiations checked")
