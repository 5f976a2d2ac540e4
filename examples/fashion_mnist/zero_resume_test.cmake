# ZeRO checkpoints move between world sizes: 3 epochs straight on 4 ranks versus 1 epoch on 4
# ranks, resumed for the 2nd on 2 ranks and for the 3rd on 1. The global batch of each step is the
# same set of samples at every world size (the sampler deals the shuffled order round-robin), so
# the runs differ only in the order of sums: the final checkpoints (weights, optimizer state,
# position) match within a relative tolerance.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(args --device cpu --model mlp --batch-size 64 --max-steps-per-epoch 8 --log-every 0 --seed 5 --schedule none)
set(np ${MPIEXEC} ${NPFLAG})
execute_process(COMMAND ${np} 4 ${MPIFLAGS} ${PROGRAM} ${args} --zero 2 --epochs 3 --save ${WORK}/straight.safetensors
                RESULT_VARIABLE r1)
execute_process(COMMAND ${np} 4 ${MPIFLAGS} ${PROGRAM} ${args} --zero 2 --epochs 1 --save ${WORK}/resumed.safetensors
                RESULT_VARIABLE r2)
execute_process(COMMAND ${np} 2 ${MPIFLAGS} ${PROGRAM} ${args} --zero 1 --epochs 2 --resume ${WORK}/resumed.safetensors
                        --save ${WORK}/resumed.safetensors RESULT_VARIABLE r3)
execute_process(COMMAND ${np} 1 ${MPIFLAGS} ${PROGRAM} ${args} --zero 2 --epochs 3 --resume ${WORK}/resumed.safetensors
                        --save ${WORK}/resumed.safetensors RESULT_VARIABLE r4)
if(NOT r1 EQUAL 0 OR NOT r2 EQUAL 0 OR NOT r3 EQUAL 0 OR NOT r4 EQUAL 0)
  message(FATAL_ERROR "a training run failed (${r1}, ${r2}, ${r3}, ${r4})")
endif()
execute_process(COMMAND ${COMPARE} ${WORK}/straight.safetensors ${WORK}/resumed.safetensors 1e-5
                RESULT_VARIABLE same)
if(NOT same EQUAL 0)
  message(FATAL_ERROR "the run resumed on 2 and then 1 ranks does not continue the 4-rank run")
endif()
