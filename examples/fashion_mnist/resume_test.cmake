# 3 epochs straight versus 2 epochs, save, resume for the 3rd: the checkpoints (weights,
# optimizer state, position, generator state) must be byte for byte the same.
# -DMODEL=cnn|mlp (default cnn); -DEXTRA="flag;flag" adds flags to every run (a precision, say).
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
if(NOT DEFINED MODEL)
  set(MODEL cnn)
endif()
# A constant learning rate: a cosine schedule would be planned over 2 epochs in the shorter run.
set(args --device cpu --model ${MODEL} --max-steps-per-epoch 15 --log-every 0 --seed 5 --schedule none ${EXTRA})
execute_process(COMMAND ${PROGRAM} ${args} --epochs 3 --save ${WORK}/straight.safetensors RESULT_VARIABLE r1)
execute_process(COMMAND ${PROGRAM} ${args} --epochs 2 --save ${WORK}/resumed.safetensors RESULT_VARIABLE r2)
execute_process(COMMAND ${PROGRAM} ${args} --epochs 3 --resume ${WORK}/resumed.safetensors
                        --save ${WORK}/resumed.safetensors RESULT_VARIABLE r3)
if(NOT r1 EQUAL 0 OR NOT r2 EQUAL 0 OR NOT r3 EQUAL 0)
  message(FATAL_ERROR "a training run failed (${r1}, ${r2}, ${r3})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/straight.safetensors ${WORK}/resumed.safetensors
                RESULT_VARIABLE same)
if(NOT same EQUAL 0)
  message(FATAL_ERROR "the resumed run ended with different parameters than the straight run")
endif()
message(STATUS "resumed run is bitwise identical to the straight run")
