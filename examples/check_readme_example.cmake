# Fails unless README.md shows the example file verbatim in a ```cpp block, so the two cannot
# drift apart. Run by CTest: cmake -DREADME=<README.md> -DEXAMPLE=<file.cpp> -P <this file>
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "```cpp\n${example}```\n" position)
if(position EQUAL -1)
  message(FATAL_ERROR "README.md does not show ${EXAMPLE} verbatim: copy the file into the README's "
                      "```cpp block (or the file from the README) so they match again")
endif()
message(STATUS "README.md shows ${EXAMPLE} verbatim")
