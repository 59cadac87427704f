# Big-model inference: the seed's examples (accelerate/big_modeling.py; seed "大模型推理").
# The 20-layer toy checkpoint is ~340 MB of random f32 weights: those tests are
# _nosan (skipped under ASan; the same code paths run in test_dispatch,
# test_llama_hf and test_generate there).
set(BIGMODEL_CKPT ${CMAKE_BINARY_DIR}/fake-llama-dispatch)

add_test(NAME bigmodel_empty_weights COMMAND empty_weights)
set_tests_properties(bigmodel_empty_weights PROPERTIES
  PASS_REGULAR_EXPRESSION "empty_model_params=32960\ndevice=meta\n")

add_test(NAME bigmodel_seed_save_nosan COMMAND save_fake_llama ${BIGMODEL_CKPT})
set_tests_properties(bigmodel_seed_save_nosan PROPERTIES FIXTURES_SETUP fake_llama TIMEOUT 120
  PASS_REGULAR_EXPRESSION "fake-llama-dispatch\n")

add_test(NAME bigmodel_seed_dispatch_nosan COMMAND dispatch ${BIGMODEL_CKPT})
set_tests_properties(bigmodel_seed_dispatch_nosan PROPERTIES FIXTURES_REQUIRED fake_llama
  PASS_REGULAR_EXPRESSION "first_layer_device=cpu\nlast_layer_device=disk\nout_device=cpu\nout_shape=\\[1, 3, 32000\\]\n")

add_test(NAME bigmodel_seed_dispatch_cpu_cpu_nosan COMMAND dispatch ${BIGMODEL_CKPT} --devices cpu,cpu)
set_tests_properties(bigmodel_seed_dispatch_cpu_cpu_nosan PROPERTIES FIXTURES_REQUIRED fake_llama
  PASS_REGULAR_EXPRESSION "first_layer_device=cpu\nlast_layer_device=cpu\nout_device=cpu\nout_shape=\\[1, 3, 32000\\]\n")

# The seed's split over two devices whose memory the host cannot touch.
add_test(NAME bigmodel_seed_dispatch_hostless_nosan COMMAND dispatch ${BIGMODEL_CKPT} --devices hostless:0,hostless:1)
set_tests_properties(bigmodel_seed_dispatch_hostless_nosan PROPERTIES FIXTURES_REQUIRED fake_llama
  ENVIRONMENT "ACCEL_TEST_DEVICES=2"
  PASS_REGULAR_EXPRESSION "first_layer_device=hostless:0\nlast_layer_device=hostless:1\nout_device=cpu\nout_shape=\\[1, 3, 32000\\]\n")

# A device this build lacks fails at load time, naming the map entry.
add_test(NAME bigmodel_seed_dispatch_npu_nosan COMMAND dispatch ${BIGMODEL_CKPT} --devices npu:0,npu:1)
set_tests_properties(bigmodel_seed_dispatch_npu_nosan PROPERTIES FIXTURES_REQUIRED fake_llama
  PASS_REGULAR_EXPRESSION "device_map entry 'model.embed_tokens' -> 'npu:0': unknown device 'npu:0'")
add_test(NAME bigmodel_seed_dispatch_cuda1_nosan COMMAND dispatch ${BIGMODEL_CKPT} --devices cpu,cuda:1)
set_tests_properties(bigmodel_seed_dispatch_cuda1_nosan PROPERTIES FIXTURES_REQUIRED fake_llama
  PASS_REGULAR_EXPRESSION "device_map entry 'model.layers.10' -> 'cuda:1': this device is not available")

# Greedy generation from the transformers fixture equals transformers' greedy
# (tools/gen_hf_llama_fixtures.py: expected.safetensors "greedy").
add_test(NAME bigmodel_generate_greedy COMMAND generate ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic
  --ids 23,49,33,48 --new-tokens 8 --device-map model.embed_tokens:cpu,model.layers:disk,model.norm:cpu,lm_head:disk)
set_tests_properties(bigmodel_generate_greedy PROPERTIES
  PASS_REGULAR_EXPRESSION "generated_ids=\\[23, 49, 33, 48, 0, 11, 51, 35, 11, 82, 42, 67\\]\n")

# One new token has no decode rate: "n/a", not a rate of 0.0 tokens/s.
add_test(NAME bigmodel_generate_no_decode_rate COMMAND generate ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic
  --ids 23,49,33,48 --new-tokens 1)
set_tests_properties(bigmodel_generate_no_decode_rate PROPERTIES
  PASS_REGULAR_EXPRESSION "new_tokens=1 decode_tokens_per_s=n/a\n")

# The same map saved as JSON (json.dump(model.hf_device_map), accel_device_map_load): the same ids;
# a value of another type is refused naming the file and the key.
add_test(NAME bigmodel_generate_greedy_json_map COMMAND generate ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic
  --ids 23,49,33,48 --new-tokens 8 --device-map ${CMAKE_SOURCE_DIR}/tests/data/device_maps/llama_basic_disk.json)
set_tests_properties(bigmodel_generate_greedy_json_map PROPERTIES
  PASS_REGULAR_EXPRESSION "generated_ids=\\[23, 49, 33, 48, 0, 11, 51, 35, 11, 82, 42, 67\\]\n")
add_test(NAME bigmodel_generate_bad_json_map COMMAND generate ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic
  --ids 23,49,33,48 --new-tokens 8 --device-map ${CMAKE_SOURCE_DIR}/tests/data/device_maps/bad_value.json)
set_tests_properties(bigmodel_generate_bad_json_map PROPERTIES PASS_REGULAR_EXPRESSION
  "bad_value.json: key 'model.layers': the value is neither a device name nor a GPU index")

# The same greedy ids with the resident modules on two hostless devices and
# the offloaded ones streamed from disk onto them.
add_test(NAME bigmodel_generate_greedy_hostless COMMAND generate ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic
  --ids 23,49,33,48 --new-tokens 8
  --device-map model.embed_tokens:hostless:0,model.layers:disk,model.norm:hostless:1,lm_head:disk)
set_tests_properties(bigmodel_generate_greedy_hostless PROPERTIES ENVIRONMENT "ACCEL_TEST_DEVICES=2"
  PASS_REGULAR_EXPRESSION "generated_ids=\\[23, 49, 33, 48, 0, 11, 51, 35, 11, 82, 42, 67\\]\n")

# The families and RoPE variants of tests/data/hf_arch_* on two hostless devices with a layer
# streamed from disk: transformers' greedy ids (the window mask and the scaled RoPE frequencies
# made on the layer's device). Prompt and ids: the fixtures' expected.safetensors.
foreach(spec "mistral|4,61,6,44|4, 61, 6, 44, 1, 61, 28, 1, 1, 1, 1, 1, 1, 1, 24, 24, 29, 24, 19, 59"
             "llama_longrope|50,50,46,9|50, 50, 46, 9, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 58, 58, 58, 58, 58"
             "qwen2_window|41,45,14,61|41, 45, 14, 61, 42, 18, 49, 12, 49, 49, 49, 49, 49, 49, 49, 49, 49, 49, 49, 49")
  string(REPLACE "|" ";" parts "${spec}")
  list(GET parts 0 name)
  list(GET parts 1 prompt)
  list(GET parts 2 want)
  add_test(NAME bigmodel_generate_${name}_hostless COMMAND generate ${CMAKE_SOURCE_DIR}/tests/data/hf_arch_${name}
    --ids ${prompt} --new-tokens 16
    --device-map model.embed_tokens:hostless:0,model.layers.0:hostless:1,model.layers.1:disk,model.norm:hostless:1,lm_head:disk)
  set_tests_properties(bigmodel_generate_${name}_hostless PROPERTIES ENVIRONMENT "ACCEL_TEST_DEVICES=2"
    PASS_REGULAR_EXPRESSION "generated_ids=\\[${want}\\]\n")
endforeach()

# accel's save_pretrained output loads in transformers with the same logits.
# The test runs the interpreter that passed this check (its sys.executable),
# not whatever python3 PATH (or a pyenv shim) names at test time.
set(BIGMODEL_NO_TRANSFORMERS 1)
find_program(ACCEL_PYTHON3 python3)
if(ACCEL_PYTHON3)
  execute_process(COMMAND ${ACCEL_PYTHON3} -c "import sys, transformers, safetensors, numpy; print(sys.executable)"
                  RESULT_VARIABLE BIGMODEL_NO_TRANSFORMERS OUTPUT_VARIABLE BIGMODEL_PYTHON
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
if(BIGMODEL_NO_TRANSFORMERS EQUAL 0 AND IS_ABSOLUTE "${BIGMODEL_PYTHON}")
  add_test(NAME bigmodel_hf_check_accel_nosan COMMAND sh -c
    "$<TARGET_FILE:generate> ${BIGMODEL_CKPT} --ids 1,2,3 --new-tokens 0 --dump-logits ${CMAKE_BINARY_DIR}/fake-llama-logits.npy && '${BIGMODEL_PYTHON}' ${CMAKE_SOURCE_DIR}/tools/gen_hf_llama_fixtures.py --check-accel ${BIGMODEL_CKPT} --ids 1,2,3 --logits ${CMAKE_BINARY_DIR}/fake-llama-logits.npy")
  # exit status 0 only when the logits agree within 1e-4; importing transformers
  # takes over a minute on a loaded 2-core machine (59 s alone, >120 s at load 15)
  set_tests_properties(bigmodel_hf_check_accel_nosan PROPERTIES FIXTURES_REQUIRED fake_llama TIMEOUT 300)
endif()
if(BIGMODEL_NO_TRANSFORMERS EQUAL 0 AND IS_ABSOLUTE "${BIGMODEL_PYTHON}")
  execute_process(COMMAND ${BIGMODEL_PYTHON} -c "import torch" RESULT_VARIABLE ACCEL_NO_TORCH ERROR_QUIET)
endif()
if(ACCEL_NO_TORCH EQUAL 0)
  # every family's save_pretrained (test_hf_archs) loaded by transformers'
  # AutoModelForCausalLM: its logits within 1e-5 of the fixture's
  add_test(NAME hf_archs_saved_read_by_transformers_nosan COMMAND sh -c
    "d=${CMAKE_BINARY_DIR}/hf_archs_saved && rm -rf $d && mkdir -p $d && ACCEL_TEST_SAVE_DIR=$d $<TARGET_FILE:test_hf_archs> && '${BIGMODEL_PYTHON}' ${CMAKE_SOURCE_DIR}/tools/gen_hf_arch_fixtures.py --check-saved $d; r=$?; rm -rf $d; exit $r"
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(hf_archs_saved_read_by_transformers_nosan PROPERTIES TIMEOUT 600
                       ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_GEMM_CACHE=${CMAKE_CURRENT_BINARY_DIR}/gemm_cache")
  # the .bin files accel writes (torch_save, save_model's shards under 1 and 2
  # processes, bf16, ZeRO-2) read by torch.load and from_pretrained
  add_test(NAME torch_loads_accel_nosan COMMAND ${BIGMODEL_PYTHON} tools/check_torch_loads_accel.py ${CMAKE_BINARY_DIR}
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(torch_loads_accel_nosan PROPERTIES TIMEOUT 600
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_TORCH_VERDICT=;ACCEL_GEMM_CACHE=${CMAKE_CURRENT_BINARY_DIR}/gemm_cache")
endif()

# The probe tools/sweep_device_maps.py drives: two maps of the Qwen2 fixture as Accelerate's
# infer_auto_device_map places them (after get_balanced_memory for balanced_low_0; computed by
# the sweep's peer_map), a missing directory named, and the BERT classifier's with GPU 0 able to
# hold its word embeddings but not all of BertEmbeddings, which transformers' _no_split_modules
# keeps whole: Accelerate's {"": 1} (a BertLayer-only no_split put the word embeddings on 0).
if(TARGET device_map_probe)
  add_test(NAME bigmodel_device_map_probe COMMAND sh -c
           "printf 'data/hf_arch_qwen2\\tsequential\\t0=20000,1=30000,cpu=100000\\ndata/hf_arch_qwen2\\tbalanced_low_0\\t0=40000,1=40000,cpu=100000\\nnot_there\\tauto\\t\\ndata/hf_bert_cls\\tsequential\\t0=40000,1=100000,cpu=100000\\tBertForSequenceClassification\\n' | $<TARGET_FILE:device_map_probe>"
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_device_map_probe PROPERTIES PASS_REGULAR_EXPRESSION
    "^{\"model.embed_tokens\": 1, \"model.norm\": \"cpu\", \"lm_head\": \"cpu\", \"model.layers\": \"cpu\"}\n{\"model.embed_tokens\": 1, \"model.layers.0\": 1, \"model.layers.1\": \"cpu\", \"model.norm\": \"cpu\", \"lm_head\": \"cpu\"}\nERROR not_there: no such file\n{\"\": 1}\n$")
  # --load: the map transformers 5.25's from_pretrained made for the BERT classifier over
  # max_memory {cpu: 60000, disk} (its hf_device_map, with the root's dropout) places each weight
  # where its entry says; a map of another head names modules that head lacks.
  add_test(NAME bigmodel_device_map_probe_load COMMAND sh -c
           "printf 'data/hf_bert_cls\\tdata/device_maps/bert_cls_hf.json\\tBertForSequenceClassification\\ndata/hf_bert_cls\\tdata/device_maps/bert_cls_hf.json\\tBertForMaskedLM\\n' | $<TARGET_FILE:device_map_probe> --load"
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_device_map_probe_load PROPERTIES PASS_REGULAR_EXPRESSION
    "^{\"bert.embeddings.word_embeddings.weight\": \"cpu\", [^\n]*\"bert.embeddings.LayerNorm.bias\": \"cpu\", \"bert.encoder.layer.0.attention.self.query.weight\": \"disk\", [^\n]*\"bert.pooler.dense.bias\": \"disk\", \"classifier.weight\": \"disk\", \"classifier.bias\": \"disk\"}\nERROR [^\n]*device_map keys do not match any submodule or tensor of the model: \\['bert.pooler', 'classifier'\\]\n$")
endif()

# bigmodel_estimate_memory_NAME: `accel estimate-memory data/DIR ARGS...`
# run from tests/, its output matching REGEX (the rows below).
function(estimate_memory_test name dir regex)
  add_test(NAME bigmodel_estimate_memory_${name} COMMAND accel_cli estimate-memory data/${dir} ${ARGN}
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_${name} PROPERTIES PASS_REGULAR_EXPRESSION "${regex}")
endfunction()

# accel estimate-memory on the seed's 20-layer config: the exact table
# Accelerate 1.15's estimate-memory prints for the same LlamaConfig (it
# measures AutoModel: no lm_head).
if(TARGET accel_cli)
  add_test(NAME bigmodel_estimate_memory COMMAND accel_cli estimate-memory data/llama_seed_config
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory PROPERTIES PASS_REGULAR_EXPRESSION
    "│ Memory Usage for loading `data/llama_seed_config`  │\n├───────┬─────────────┬──────────┬───────────────────┤\n│ dtype │Largest Layer│Total Size│Training using Adam│\n├───────┼─────────────┼──────────┼───────────────────┤\n│float32│   62.5 MB   │262.58 MB │      1.03 GB      │\n│float16│   31.25 MB  │131.29 MB │     525.16 MB     │\n│  int8 │   15.62 MB  │ 65.65 MB │        N/A        │\n│  int4 │   7.81 MB   │ 32.82 MB │        N/A        │\n└───────┴─────────────┴──────────┴───────────────────┘")
  # A Qwen2 (q/k/v biases; Qwen2DecoderLayer not split): Accelerate's calculate_maximum_sizes of
  # transformers' Qwen2Model of that config.json gives 24.5 KB / 57.16 KB.
  estimate_memory_test(qwen2 hf_arch_qwen2 "│float32│   24.5 KB   │ 57.16 KB │     228.62 KB     │" --dtypes float32)
  # Gemma2 (four norms a layer; the embedding's scale buffer) and Granite: Accelerate's
  # calculate_maximum_sizes of transformers' Gemma2Model / GraniteModel of those config.json files.
  estimate_memory_test(gemma2 hf_arch_gemma2 "│float32│   24.5 KB   │ 57.16 KB │     228.64 KB     │" --dtypes float32)
  # Gemma's embedding scale is a buffer of its embedding layer, the largest here (128000 bytes of
  # weight + 4): Accelerate's largest layer in int4 is 16000.5 bytes, 15.63 KB (15.62 without it;
  # tools/sweep_estimate_memory.py found it)
  estimate_memory_test(gemma_embed_scale gemma_embed_scale_config "│ int4│   15.63 KB  │ 17.93 KB │" --dtypes int4)
  # Gemma 3 (q/k norms; a pair of rotary buffers for each of its two layer types, the first
  # layer a full_attention one): Accelerate's calculate_maximum_sizes of transformers'
  # Gemma3TextModel of that config.json gives 24.56 KB / 81.88 KB (83844 bytes).
  estimate_memory_test(gemma3 hf_arch_gemma3_linear "│float32│   24.56 KB  │ 81.88 KB │      327.52 KB      │" --dtypes float32)
  # Phi-3 with partial_rotary_factor 0.5: transformers' rotary buffers hold rotary_dim / 2 = 2 floats
  # each (Accelerate: 24.25 KB / 56.64 KB; they were counted as head_dim / 2, 56.66 KB)
  estimate_memory_test(phi3 hf_arch_phi3 "│float32│   24.25 KB  │ 56.64 KB │     226.56 KB     │" --dtypes float32)
  # microsoft/phi-2 (PhiModel, tools/gen_moe_memory_fixture.py phi2_config): `accelerate estimate-memory`'s
  # own table (2779683840 parameters in the causal LM, as transformers counts them); per rank under tp 2:
  # q/k/v, fc1 and the vocabulary (lm_head's bias too) halved, dense and fc2 by their inputs (biases
  # whole), LayerNorms whole: 1390008320 f32 parameters, 5.18 GiB (summed by hand from the config)
  estimate_memory_test(phi2 phi2_config "│float32│   500.0 MB  │ 9.87 GB  │      39.47 GB     │\n│float16│   250.0 MB  │ 4.93 GB  │      19.73 GB     │\n│  int8 │   125.0 MB  │ 2.47 GB  │        N/A        │\n│  int4 │   62.5 MB   │ 1.23 GB  │        N/A        │")
  estimate_memory_test(phi2_tp phi2_config "DDP \\(NO_SHARD\\)    │5.18 GB│ 5.18 GB │ 10.36 GB│" --num_processes 2 --tp_size 2)
  # EleutherAI/pythia-1b (GPTNeoXModel, tools/gen_moe_memory_fixture.py pythia1b_config): `accelerate
  # estimate-memory`'s own table (1011781632 parameters in the causal LM, as transformers counts them; embed_in
  # the largest layer); per rank under tp 2: query_key_value (by heads), dense_h_to_4h and the vocabulary
  # (embed_in, embed_out) halved, dense and dense_4h_to_h by their inputs (biases whole), LayerNorms whole:
  # 505991168 f32 parameters, 1.88 GiB (summed by hand from the config)
  estimate_memory_test(pythia1b pythia1b_config "│float32│   393.0 MB  │ 3.39 GB  │      13.54 GB     │\n│float16│   196.5 MB  │ 1.69 GB  │      6.77 GB      │\n│  int8 │   98.25 MB  │866.66 MB │        N/A        │\n│  int4 │   49.12 MB  │433.33 MB │        N/A        │")
  estimate_memory_test(pythia1b_tp pythia1b_config "DDP \\(NO_SHARD\\)    │1.88 GB│ 1.88 GB │ 3.77 GB │" --num_processes 2 --tp_size 2)
  # stabilityai/stablelm-2-1_6b and bigcode/starcoder2-3b (StableLmModel, Starcoder2Model;
  # tools/gen_moe_memory_fixture.py stablelm2_1_6b_config starcoder2_3b_config): `accelerate
  # estimate-memory`'s own tables (1644515328 and 3181366272 parameters in the causal LMs, as
  # transformers' estimate counts them, Starcoder2's tied head counted apart from the embedding; Starcoder2's
  # biases, StableLM's q/k/v biases)
  estimate_memory_test(stablelm stablelm2_1_6b_config "│float32│   784.0 MB  │ 5.36 GB  │       21.44 GB      │\n│float16│   392.0 MB  │ 2.68 GB  │       10.72 GB      │\n│  int8 │   196.0 MB  │ 1.34 GB  │         N/A         │\n│  int4 │   98.0 MB   │686.17 MB │         N/A         │")
  # stabilityai/stablelm-2-12b's sizes with qk_layernorm (gen_moe_memory_fixture.py stablelm2_12b_config:
  # 12143185920 parameters in the causal LM; its per-head q/k norms' 256000 also in test_device_map)
  estimate_memory_test(stablelm_12b stablelm2_12b_config "│float32│   1.91 GB   │ 43.32 GB │       173.29 GB       │\n│float16│   980.0 MB  │ 21.66 GB │        86.65 GB       │\n│  int8 │   490.0 MB  │ 10.83 GB │          N/A          │\n│  int4 │   245.0 MB  │ 5.42 GB  │          N/A          │")
  estimate_memory_test(starcoder2 starcoder2_3b_config "│float32│   576.0 MB  │ 11.29 GB │        45.16 GB       │\n│float16│   288.0 MB  │ 5.64 GB  │        22.58 GB       │\n│  int8 │   144.0 MB  │ 2.82 GB  │          N/A          │\n│  int4 │   72.0 MB   │ 1.41 GB  │          N/A          │")
  estimate_memory_test(granite hf_arch_granite "│float32│   24.25 KB  │ 56.66 KB │     226.62 KB     │" --dtypes float32)
  # GPT-2 (GPT2Block not split, no RoPE buffers): Accelerate's calculate_maximum_sizes of transformers'
  # GPT2Model of that config.json gives 112.5 KB / 216.0 KB. With a batch, its own step's activations
  # (tests/test_training_memory.c measures them; f32: the same figure on every CPU).
  estimate_memory_test(gpt2 hf_arch_gpt2 "│float32│   112.5 KB  │ 216.0 KB │      864.0 KB     │" --dtypes float32)
  add_test(NAME bigmodel_estimate_memory_gpt2_batch COMMAND accel_cli estimate-memory data/hf_arch_gpt2
           --num_processes 2 --batch_size 2 --seq_len 16 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_gpt2_batch PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2"
    PASS_REGULAR_EXPRESSION
    "│    DDP \\(NO_SHARD\\)    │216.0 KB│ 216.0 KB│ 432.0 KB│   0 bytes    │ 941.17 KB │1.76 MB│.*│ ZeRO-3 \\(FULL_SHARD\\)  │108.0 KB│ 108.0 KB│ 216.0 KB│   450.0 KB   │  1.04 MB  │1.91 MB│")
  # The real mixtures of experts, Mixtral-8x7B and Qwen3-30B-A3B (bfloat16 config.json files, as on the Hub:
  # the table is float32's, as Accelerate builds the model; read in the config's dtype it was half of it):
  # `accelerate estimate-memory`'s own table of transformers' MixtralModel / Qwen3MoeModel of those configs
  # (tools/gen_moe_memory_fixture.py; MixtralDecoderLayer / Qwen3MoeDecoderLayer unsplit). Under --tp_size
  # the experts are refused (no tp plan for them).
  estimate_memory_test(mixtral mixtral_8x7b_config "│float32│   5.41 GB   │173.49 GB │        693.97 GB        │\n│float16│    2.7 GB   │ 86.75 GB │        346.99 GB        │\n│  int8 │   1.35 GB   │ 43.37 GB │           N/A           │\n│  int4 │  692.02 MB  │ 21.69 GB │           N/A           │")
  estimate_memory_test(qwen3_moe qwen3_30b_a3b_config "│float32│   2.32 GB   │112.58 GB │       450.33 GB       │\n│float16│   1.16 GB   │ 56.29 GB │       225.16 GB       │\n│  int8 │  594.25 MB  │ 28.15 GB │          N/A          │\n│  int4 │  297.13 MB  │ 14.07 GB │          N/A          │")
  # Qwen1.5-MoE-A2.7B (Qwen2MoeModel: 60 experts beside a shared expert in each layer)
  estimate_memory_test(qwen2_moe qwen15_moe_a27b_config "│float32│   2.13 GB   │ 52.17 GB │     208.69 GB     │\n│float16│   1.06 GB   │ 26.09 GB │     104.34 GB     │\n│  int8 │  544.13 MB  │ 13.04 GB │        N/A        │\n│  int4 │  272.06 MB  │ 6.52 GB  │        N/A        │")
  # per rank under tp 2: as Qwen3-30B-A3B's, and the shared experts halved, their gates whole:
  # 26.671 GiB of f32 weights (summed by hand from the config)
  estimate_memory_test(qwen2_moe_tp qwen15_moe_a27b_config "DDP \\(NO_SHARD\\)    │26.67 GB│ 26.67 GB│ 53.34 GB│" --num_processes 2 --tp_size 2)
  add_test(NAME bigmodel_estimate_memory_moe_tp COMMAND accel_cli estimate-memory data/qwen3_30b_a3b_config
           --num_processes 2 --tp_size 2 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  # per rank under tp 2: q/k/v/o, the experts' projections and the vocabulary halved, the routers
  # and norms whole: 56.894 GiB of f32 weights (summed by hand from the config)
  set_tests_properties(bigmodel_estimate_memory_moe_tp PROPERTIES PASS_REGULAR_EXPRESSION
    "DDP \\(NO_SHARD\\)    │56.89 GB│ 56.89 GB│113.79 GB│")
  # BERT: Accelerate's calculate_maximum_sizes of transformers' BertModel of those config.json files
  # (its position_ids / token_type_ids buffers counted; BertLayer and BertEmbeddings unsplit: the
  # embeddings are hf_bert_nlp's largest layer, with the buffers).
  estimate_memory_test(bert hf_bert_cls "│float32│   29.31 KB  │ 75.75 KB │      303.0 KB     │\n│float16│   14.66 KB  │ 37.88 KB │      151.5 KB     │" --dtypes float32 float16)
  # a token classifier's (and a QA model's) body has no pooler; Accelerate's AutoModel, a BertModel, has
  estimate_memory_test(bert_token hf_bert_tok "│float32│   7.66 KB   │ 12.72 KB │      50.88 KB     │" --dtypes float32)
  estimate_memory_test(bert_embeddings hf_bert_nlp "│float32│   159.5 KB  │230.38 KB │      921.5 KB     │.*│ ZeRO-3 \\(FULL_SHARD\\)  │114.82 KB│114.82 KB│229.63 KB│" --dtypes float32 --num_processes 2)
  # BERT's step activations (accel_bert_activation_bytes; f32: the same figure on every CPU), and a
  # sequence longer than its positions refused
  add_test(NAME bigmodel_estimate_memory_bert_batch COMMAND accel_cli estimate-memory data/hf_bert_nlp
           --batch_size 2 --seq_len 8 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_bert_batch PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2"
    PASS_REGULAR_EXPRESSION
    "per rank \\(batch 2 x 8, f32\\).*│    DDP \\(NO_SHARD\\)    │229.63 KB│229.63 KB│459.27 KB│   0 bytes    │ 238.45 KB │1.13 MB│")
  # RoBERTa and XLM-RoBERTa: `accelerate estimate-memory`'s own tables for roberta-base's and
  # xlm-roberta-base's config.json (its hub lookup pointed at these files; RobertaModel with its pooler,
  # which no RoBERTa head has, RobertaEmbeddings unsplit with its two buffers), and for the tiny
  # hf_xlm_roberta_tok (a few bytes off would show); and RoBERTa's step activations (its masked LM's:
  # roberta_base_config names RobertaForMaskedLM).
  estimate_memory_test(roberta roberta_base_config "│float32│  148.78 MB  │475.49 MB │         1.86 GB         │\n│float16│   74.39 MB  │237.75 MB │        950.99 MB        │" --dtypes float32 float16)
  estimate_memory_test(xlm_roberta xlm_roberta_base_config "│float32│  733.95 MB  │ 1.04 GB  │       4.14 GB       │\n│float16│  366.98 MB  │530.33 MB │       2.07 GB       │" --dtypes float32 float16)
  estimate_memory_test(xlm_roberta_tiny hf_xlm_roberta_tok "│float32│   2.08 KB   │ 4.23 KB  │          16.94 KB         │" --dtypes float32)
  add_test(NAME bigmodel_estimate_memory_roberta_batch COMMAND accel_cli estimate-memory data/roberta_base_config
           --batch_size 2 --seq_len 8 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_roberta_batch PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2"
    PASS_REGULAR_EXPRESSION
    "per rank \\(batch 2 x 8, f32\\).*│    DDP \\(NO_SHARD\\)    │475.68 MB│475.68 MB│951.37 MB│   0 bytes    │  35.5 MB  │1.89 GB│")
  # the masked LM's step where config.json names it (and no task head): its logits over the vocabulary
  add_test(NAME bigmodel_estimate_memory_bert_mlm_batch COMMAND accel_cli estimate-memory data/hf_bert_mlm
           --batch_size 2 --seq_len 8 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_bert_mlm_batch PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2"
    PASS_REGULAR_EXPRESSION
    "per rank \\(batch 2 x 8, f32\\).*│    DDP \\(NO_SHARD\\)    │12.75 KB│ 12.75 KB│ 25.5 KB │   0 bytes    │  76.25 KB │127.25 KB│")
  # multiple choice: --batch_size examples of --num_choices rows each; without --num_choices, refused by name
  add_test(NAME bigmodel_estimate_memory_bert_mc_batch COMMAND accel_cli estimate-memory data/hf_bert_mc
           --batch_size 2 --seq_len 8 --num_choices 4 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_bert_mc_batch PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2"
    PASS_REGULAR_EXPRESSION
    "per rank \\(batch 2 x 4 choices x 8, f32\\).*│    DDP \\(NO_SHARD\\)    │12.54 KB│ 12.54 KB│ 25.07 KB│   0 bytes    │ 258.83 KB │308.97 KB│")
  estimate_memory_test(bert_mc_no_choices hf_bert_mc "a BertForMultipleChoice runs each of the --batch_size examples as one row per choice: give --num_choices N" --batch_size 2 --seq_len 8)
  add_test(NAME bigmodel_estimate_memory_bert_choices_elsewhere COMMAND accel_cli estimate-memory data/hf_bert_cls
           --batch_size 2 --seq_len 8 --num_choices 4 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_bert_choices_elsewhere PROPERTIES PASS_REGULAR_EXPRESSION
    "--num_choices is for a multiple-choice model \\(BertForMultipleChoice\\); this one is a BertForSequenceClassification")
  # a usage error for a decoder too, even where its pipeline table would not read the flag
  add_test(NAME bigmodel_estimate_memory_choices_decoder_pp COMMAND accel_cli estimate-memory data/hf_arch_mistral
           --batch_size 4 --seq_len 8 --pp_size 2 --num_choices 3 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_choices_decoder_pp PROPERTIES PASS_REGULAR_EXPRESSION
    "--num_choices is for a multiple-choice model \\(BertForMultipleChoice\\); this one is a decoder")
  # the training tables hold the config's own head (the masked LM's decoder and transform), batch or not
  estimate_memory_test(bert_mlm_ranks hf_bert_mlm "│    DDP \\(NO_SHARD\\)    │12.75 KB│ 12.75 KB│ 25.5 KB │   0 bytes    │51.0 KB │" --num_processes 2)
  # the loading table of a masked LM accel cannot build (an untied decoder) does not depend on the head: printed
  add_test(NAME bigmodel_estimate_memory_bert_mlm_untied COMMAND sh -c
           "d=$(mktemp -d) && sed 's/\"tie_word_embeddings\": true/\"tie_word_embeddings\": false/' data/hf_bert_mlm/config.json > $d/config.json && $<TARGET_FILE:accel_cli> estimate-memory $d --dtypes float32; echo rc=$?; rm -rf $d"
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_bert_mlm_untied PROPERTIES PASS_REGULAR_EXPRESSION
    "│float32│.*rc=0")
  # tables that cannot be written (a full disk): an error and exit 1, though they fit stdio's buffer
  add_test(NAME bigmodel_estimate_memory_full_stdout COMMAND sh -c
           "$<TARGET_FILE:accel_cli> estimate-memory data/hf_bert_cls > /dev/full; echo rc=$?"
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_full_stdout PROPERTIES PASS_REGULAR_EXPRESSION
    "cannot write the tables: No space left on device.*rc=1")
  estimate_memory_test(bert_long hf_bert_nlp "accel_bert_activation_bytes: seq_len 65 is more than max_position_embeddings \\(64\\)" --batch_size 2 --seq_len 65)
endif()

# 200000 members built, addressed, measured, saved and loaded: linear in the
# member count (the quadratic versions took many minutes; config.json's
# num_hidden_layers comes from a file). The plain many_members runs 2000.
add_test(NAME many_members_large_nosan COMMAND test_many_members 200000)
set_tests_properties(many_members_large_nosan PROPERTIES TIMEOUT 120)

# Sizes from config.json are capped and overflow-checked: an error at once,
# never a hang (10^6 layers) or a wrapped size (an lm_head of 2^66 bytes).
if(TARGET accel_cli)
  add_test(NAME bigmodel_estimate_memory_layers COMMAND accel_cli estimate-memory data/llama_bad_configs/layers_1e6.json
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_layers PROPERTIES TIMEOUT 20 PASS_REGULAR_EXPRESSION
    "accel estimate-memory: data/llama_bad_configs/layers_1e6.json: num_hidden_layers 1000000 is over accel's limit of 65536\n")
  add_test(NAME bigmodel_estimate_memory_overflow COMMAND accel_cli estimate-memory data/llama_bad_configs/lm_head_2e66.json
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_overflow PROPERTIES TIMEOUT 20 PASS_REGULAR_EXPRESSION
    "lm_head_2e66.json: the weights would take more than 2\\^63 bytes")
  # BERT's position_ids / token_type_ids buffers (2 x max_position_embeddings int64) added to weights
  # just under 2^62 bytes wrapped the total negative (a table of "-9223372036854774784 bytes", UBSan's
  # signed overflow): refused, naming max_position_embeddings.
  add_test(NAME bigmodel_estimate_memory_bert_buffers COMMAND accel_cli estimate-memory
           data/bert_bad_configs/positions_2e58.json WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_bert_buffers PROPERTIES TIMEOUT 20 PASS_REGULAR_EXPRESSION
    "^accel estimate-memory: data/bert_bad_configs/positions_2e58.json: the weights and buffers would take more than 2\\^63 bytes \\(max_position_embeddings 288230376151711743\\)\n$")
  # The pipeline table's micro-batch inputs [B / M, T, C] of an absurd sequence: the product wrapped to
  # "0 bytes each" and the table showed the weights alone (UBSan's signed overflow); refused by name.
  add_test(NAME bigmodel_estimate_memory_pp_inputs_overflow COMMAND accel_cli estimate-memory data/llama_seed_config
           --pp_size 2 --batch_size 2 --seq_len 576460752303423488 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_pp_inputs_overflow PROPERTIES TIMEOUT 20 PASS_REGULAR_EXPRESSION
    "accel estimate-memory: error: a micro-batch's inputs \\[2, 576460752303423488, 512\\] float32 between the stages would take more than 2\\^62 bytes")
  # Each micro-batch's inputs just within 2^62 bytes, but a stage holding 8 of them under gpipe: their
  # sum past 2^63 is refused by name (the product would wrap).
  add_test(NAME bigmodel_estimate_memory_pp_held_overflow COMMAND accel_cli estimate-memory data/llama_seed_config
           --pp_size 4 --batch_size 16 --num_micro_batches 8 --pp_schedule gpipe --seq_len 1125899906842624
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_pp_held_overflow PROPERTIES TIMEOUT 20 PASS_REGULAR_EXPRESSION
    "error: stage 1's 8 held micro-batch inputs of 4611686018427387904 bytes: more than 2\\^63 bytes")
  # --dtypes given twice: argparse's last one holds (the rows of both were printed).
  add_test(NAME bigmodel_estimate_memory_dtypes_twice COMMAND accel_cli estimate-memory data/llama_seed_config
           --dtypes float32 --dtypes int8 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_dtypes_twice PROPERTIES TIMEOUT 20
    PASS_REGULAR_EXPRESSION "│ int8│   15.62 MB  │ 65.65 MB │" FAIL_REGULAR_EXPRESSION "float32")
  # 17 dtypes (a table row each, 16 at most): refused naming the limit (it said "expected one or more of
  # float32, ...", as if a value were wrong).
  add_test(NAME bigmodel_estimate_memory_dtypes_17 COMMAND accel_cli estimate-memory data/llama_seed_config
           --dtypes int8 int8 int8 int8 int8 int8 int8 int8 int8 int8 int8 int8 int8 int8 int8 int8 int8
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_dtypes_17 PROPERTIES TIMEOUT 20
    PASS_REGULAR_EXPRESSION "argument --dtypes: at most 16 values \\(a table row each\\)")
  # A tp the runtime's plan refuses (8 heads over 3 ranks) is refused without a batch too, before any
  # table (it printed a per-rank estimate of a mesh that cannot run).
  add_test(NAME bigmodel_estimate_memory_tp_uneven COMMAND accel_cli estimate-memory data/llama_seed_config --tp_size 3
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_tp_uneven PROPERTIES TIMEOUT 20 PASS_REGULAR_EXPRESSION
    "^accel estimate-memory: error: data/llama_seed_config: --tp_size: num_attention_heads is not a multiple of tp 3")
  # The pipeline table has a row for every stage: 70 of them, the last one (the final norm and lm_head)
  # included (it stopped at 64 rows, silently).
  add_test(NAME bigmodel_estimate_memory_pp_stages COMMAND accel_cli estimate-memory data/llama_bad_configs/layers_70.json
           --pp_size 70 --batch_size 2 --seq_len 4 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(bigmodel_estimate_memory_pp_stages PROPERTIES TIMEOUT 20 PASS_REGULAR_EXPRESSION
    "│  69 │  69  │2.34 KB│ 2.34 KB │ 4.69 KB │    1    │ 256 bytes │ +9.62 KB +│\n└")
endif()
add_test(NAME bigmodel_generate_layers COMMAND generate data/llama_bad_configs/layers_1e6.json
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
set_tests_properties(bigmodel_generate_layers PROPERTIES TIMEOUT 20 PASS_REGULAR_EXPRESSION
  "generate: data/llama_bad_configs/layers_1e6.json: num_hidden_layers 1000000 is over accel's limit")

# Sampling parameters out of range are refused before the model loads, naming
# the parameter (transformers' warpers raise); numbers must be whole numbers.
foreach(bad "top-p;5;accel_generate: `top_p` has to be a float in \\(0, 1\\]" "temperature;0;--temperature 0: has to be > 0"
            "top-p;0;--top-p 0: has to be > 0" "temperature;-1;accel_generate: `temperature` \\(=-1\\)"
            "top-k;-3;accel_generate: `top_k` has to be a non-negative integer")
  list(GET bad 0 flag)
  list(GET bad 1 value)
  list(GET bad 2 regex)
  add_test(NAME bigmodel_generate_bad_${flag}_${value} COMMAND generate ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic
           --sample --${flag} ${value})
  set_tests_properties(bigmodel_generate_bad_${flag}_${value} PROPERTIES PASS_REGULAR_EXPRESSION "generate: ${regex}")
endforeach()
add_test(NAME bigmodel_generate_bad_number COMMAND generate ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic --sample --temperature 0.5x)
set_tests_properties(bigmodel_generate_bad_number PROPERTIES PASS_REGULAR_EXPRESSION "generate: --temperature: '0.5x' is not a number")
add_test(NAME bigmodel_generate_sample_ok COMMAND generate ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic
         --ids 23,49 --new-tokens 3 --sample --temperature 0.7 --top-k 5 --top-p 0.9 --seed 3)
set_tests_properties(bigmodel_generate_sample_ok PROPERTIES PASS_REGULAR_EXPRESSION "generated_ids=\\[23, 49, [0-9]+, [0-9]+, [0-9]+\\]\n")

# Every test that needs Python runs the interpreter configure found (see above).
add_test(NAME tests_pinned_python COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/check_pinned_python.sh ${CMAKE_BINARY_DIR})
