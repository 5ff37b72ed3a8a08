# KH_SANITIZE=address,undefined builds everything with those sanitizers (make test does).
set(KH_SANITIZE "" CACHE STRING "comma-separated -fsanitize= list, e.g. address,undefined")
if(KH_SANITIZE)
  add_compile_options(-fsanitize=${KH_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=${KH_SANITIZE})
endif()
