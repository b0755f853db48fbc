# Sets PARM_HAVE_PYTHON (and the target pybind11::module) from PARM_PYTHON = AUTO | ON | OFF.
# The module is built for Debian's python3 (/usr/bin/python3 by default: the first python3
# on PATH may be another interpreter without Debian's torch and numpy); set
# Python_EXECUTABLE to build for another.
set(PARM_HAVE_PYTHON OFF)
include(${CMAKE_CURRENT_LIST_DIR}/optional.cmake)
parm_optional(PARM_PYTHON parm_python_required)

if(NOT Python_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "The python3 the module is built for")
endif()
find_package(Python 3 QUIET COMPONENTS Interpreter Development.Module)
set(parm_python_missing "")
if(NOT Python_FOUND)
  list(APPEND parm_python_missing "python3 with its headers (python3-dev)")
else()
  find_package(pybind11 CONFIG QUIET)
  if(NOT pybind11_FOUND)
    list(APPEND parm_python_missing "pybind11 (pybind11-dev)")
  endif()
  find_path(PARM_DLPACK_INCLUDE_DIR dlpack/dlpack.h)  # tensors cross as DLPack capsules
  if(NOT PARM_DLPACK_INCLUDE_DIR)
    list(APPEND parm_python_missing "the DLPack header (libdlpack-dev)")
  endif()
endif()

if(parm_python_missing)
  list(JOIN parm_python_missing ", " parm_python_missing)
  if(parm_python_required)
    message(FATAL_ERROR "PARM_PYTHON=ON but missing: ${parm_python_missing} "
                        "(scripts/install-deps installs them)")
  endif()
  message(STATUS "Python module: off (missing ${parm_python_missing})")
  return()
endif()
set(PARM_HAVE_PYTHON ON)
# Where `cmake --install` puts the package: the interpreter's site directory for local
# platform modules (Debian: /usr/local/lib/python3.X/dist-packages, on its sys.path), unless
# PARM_PYTHON_INSTALL_DIR says.
if(NOT PARM_PYTHON_INSTALL_DIR)
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c
            "import sysconfig; print(sysconfig.get_path('platlib'))"
    OUTPUT_VARIABLE PARM_PYTHON_INSTALL_DIR OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
message(STATUS "Python module: on (${Python_EXECUTABLE}, installs into ${PARM_PYTHON_INSTALL_DIR})")
