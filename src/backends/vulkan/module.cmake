# The Vulkan backend: volk (the loader is opened at run time, so anvil runs without Vulkan)
# and the shaders, compiled by glslc at build time into uint32_t arrays (generated/shaders).
find_program(GLSLC glslc REQUIRED)
set(ANVIL_VK_DIR ${CMAKE_CURRENT_LIST_DIR})
set(ANVIL_SHADER_OUT ${CMAKE_CURRENT_BINARY_DIR}/generated/shaders)
file(MAKE_DIRECTORY ${ANVIL_SHADER_OUT})

# name source defines
set(ANVIL_SHADER_VARIANTS
  "matvec_f32 matvec.comp -DW_F32"
  "matvec_f16 matvec.comp -DW_F16"
  "matvec_bf16 matvec.comp -DW_BF16"
  "matvec_q8_0 matvec.comp -DW_Q8_0"
  "matvec_q4_0 matvec.comp -DW_Q4_0"
  "matvec_q4_1 matvec.comp -DW_Q4_1"
  "matvec_q5_0 matvec.comp -DW_Q5_0"
  "matvec_q5_1 matvec.comp -DW_Q5_1"
  "matvec_q4_k matvec.comp -DW_Q4_K"
  "matvec_q5_k matvec.comp -DW_Q5_K"
  "matvec_q6_k matvec.comp -DW_Q6_K"
  "embed_f32 embed.comp -DW_F32"
  "embed_f16 embed.comp -DW_F16"
  "embed_bf16 embed.comp -DW_BF16"
  "embed_q8_0 embed.comp -DW_Q8_0"
  "embed_q4_0 embed.comp -DW_Q4_0"
  "embed_q4_1 embed.comp -DW_Q4_1"
  "embed_q5_0 embed.comp -DW_Q5_0"
  "embed_q5_1 embed.comp -DW_Q5_1"
  "embed_q4_k embed.comp -DW_Q4_K"
  "embed_q5_k embed.comp -DW_Q5_K"
  "embed_q6_k embed.comp -DW_Q6_K"
  "attention attention.comp -DANVIL"
  "argmax argmax.comp -DANVIL"
  "ew ew.comp -DANVIL"
  "prefetch prefetch.comp -DANVIL"
  "moe_topk moe_topk.comp -DANVIL"
  "moe_rows moe_rows.comp -DANVIL"
  "gdn gdn.comp -DANVIL"
  "sample sample.comp -DANVIL"
  "mm_f32 mm.comp -DW_F32"
  "mm_f16 mm.comp -DW_F16"
  "mm_bf16 mm.comp -DW_BF16"
  "mm_q8_0 mm.comp -DW_Q8_0"
  "mm_q4_0 mm.comp -DW_Q4_0"
  "mm_q4_1 mm.comp -DW_Q4_1"
  "mm_q5_0 mm.comp -DW_Q5_0"
  "mm_q5_1 mm.comp -DW_Q5_1"
  "mm_q4_k mm.comp -DW_Q4_K"
  "mm_q5_k mm.comp -DW_Q5_K"
  "mm_q6_k mm.comp -DW_Q6_K"
  "rows rows.comp -DANVIL"
  "attn_prefill attn_prefill.comp -DANVIL"
  "dq_f32 dq.comp -DW_F32"
  "dq_f16 dq.comp -DW_F16"
  "dq_bf16 dq.comp -DW_BF16"
  "dq_q8_0 dq.comp -DW_Q8_0"
  "dq_q4_0 dq.comp -DW_Q4_0"
  "dq_q4_1 dq.comp -DW_Q4_1"
  "dq_q5_0 dq.comp -DW_Q5_0"
  "dq_q5_1 dq.comp -DW_Q5_1"
  "dq_q4_k dq.comp -DW_Q4_K"
  "dq_q5_k dq.comp -DW_Q5_K"
  "dq_q6_k dq.comp -DW_Q6_K"
  "mm_h_64x64_k32 mm_h.comp -DWM=2u -DTM=2u -DTN=1u -DBK=32u"
  "mm_h_64x64_k64 mm_h.comp -DWM=2u -DTM=2u -DTN=1u -DBK=64u"
  "mm_h_moe mm_h.comp -DWM=1u -DTM=2u -DTN=1u -DBK=32u -DGATHER"
  "attn_flash attn_flash.comp -DANVIL"
  "qx qx.comp -DANVIL"
  "matvec_qx_q8_0 matvec.comp -DW_Q8_0 -DQX -DQWIDE8"
  "matvec_qx_q6_k matvec.comp -DW_Q6_K -DQX"
  "matvec_qxv_q8_0 matvec.comp -DW_Q8_0 -DQX -DQXV -DQWIDE8"
  "matvec_qxt_q8_0 matvec.comp -DW_Q8_0 -DQX -DQXV -DQXT -DQWIDE8"
  "matvec_qxw_q4_k matvec.comp -DW_Q4_K -DQX -DQWIDE"
  "matvec_qxvw_q4_k matvec.comp -DW_Q4_K -DQX -DQXV -DQWIDE"
  "matvec_qxtw_q4_k matvec.comp -DW_Q4_K -DQX -DQXV -DQXT -DQWIDE"
  "matvec_qxw_q5_k matvec.comp -DW_Q5_K -DQX -DQWIDE"
  "matvec_qxvw_q5_k matvec.comp -DW_Q5_K -DQX -DQXV -DQWIDE"
  "matvec_qxtw_q5_k matvec.comp -DW_Q5_K -DQX -DQXV -DQXT -DQWIDE"
  "matvec_qxv_q6_k matvec.comp -DW_Q6_K -DQX -DQXV"
  "matvec_qxt_q6_k matvec.comp -DW_Q6_K -DQX -DQXV -DQXT"
  "matvec_route_f32 matvec.comp -DW_F32 -DROUTE"
  "matvec_route_f16 matvec.comp -DW_F16 -DROUTE"
  "matvec_route_bf16 matvec.comp -DW_BF16 -DROUTE"
  "mega_f32 mega.comp -DW_F32"
  "mega_f16 mega.comp -DW_F16"
  "mega_bf16 mega.comp -DW_BF16"
  "mega_bf16_clk mega.comp -DW_BF16 -DCLOCK"
  "mega_qx mega.comp -DMQX -DQX"
  "mega_qx_clk mega.comp -DMQX -DQX -DCLOCK")
set(ANVIL_SHADER_INCS)
file(GLOB ANVIL_SHADER_DEPS CONFIGURE_DEPENDS ${ANVIL_VK_DIR}/shaders/*.glsl ${ANVIL_VK_DIR}/shaders/*.comp)
foreach(v ${ANVIL_SHADER_VARIANTS})
  separate_arguments(parts UNIX_COMMAND "${v}")
  list(GET parts 0 name)
  list(GET parts 1 src)
  list(SUBLIST parts 2 -1 defs)
  add_custom_command(
    OUTPUT ${ANVIL_SHADER_OUT}/${name}.inc
    COMMAND ${GLSLC} --target-env=vulkan1.2 -O -mfmt=c ${defs} -o ${ANVIL_SHADER_OUT}/${name}.inc ${ANVIL_VK_DIR}/shaders/${src}
    DEPENDS ${ANVIL_SHADER_DEPS}
    COMMENT "glslc ${name}")
  list(APPEND ANVIL_SHADER_INCS ${ANVIL_SHADER_OUT}/${name}.inc)
endforeach()
add_custom_target(anvil_shaders DEPENDS ${ANVIL_SHADER_INCS})
list(APPEND ANVIL_OBJ_DEPENDS anvil_shaders)

# volk ships as a header plus volk.c (libvulkan-volk-dev); it is compiled into the library.
list(APPEND ANVIL_SOURCES /usr/include/volk.c)
set_source_files_properties(/usr/include/volk.c PROPERTIES COMPILE_OPTIONS "-w")
add_compile_definitions(VK_NO_PROTOTYPES)
list(APPEND ANVIL_DEPS ${CMAKE_DL_LIBS})
