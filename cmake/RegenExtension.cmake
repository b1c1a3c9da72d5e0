# regen_add_extension(target sources...): a shared object that registers models (and planners)
# into a regen that is already loaded, such as the Python module (regen.load_extension), without a
# copy of regen of its own: it is compiled against regen's headers (regen::headers) and links none
# of regen's libraries, so its references to regen resolve to the loader's at load time. It must
# define `extern "C" void regen_extension_init()`. Installed with the package (find_package(regen)
# gives it); examples/unet builds one.
function(regen_add_extension target)
  add_library(${target} MODULE ${ARGN})
  target_link_libraries(${target} PRIVATE regen::headers)
  set_target_properties(${target} PROPERTIES PREFIX "" POSITION_INDEPENDENT_CODE ON)
endfunction()
