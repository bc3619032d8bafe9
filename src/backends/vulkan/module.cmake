# The Vulkan backend: volk (the loader is opened at run time, so anvil runs without Vulkan)
# and the shaders, compiled by glslc at build time into uint32_t arrays (generated/shaders).
find_program(GLSLC glslc REQUIRED)
set(ANVIL_VK_DIR ${CMAKE_CURRENT_LIST_DIR})
set(ANVIL_SHADER_OUT ${CMAKE_CURRENT_BINARY_DIR}/generated/shaders)
file(MAKE_DIRECTORY ${ANVIL_SHADER_OUT})

# -DANVIL_SPIRV_FROM=DIR: take each shader's SPIR-V from another build of this same source tree
# (DIR = its generated/shaders) instead of compiling it again: CI's second build (the
# sanitizers') saves the ~3 minutes of CPU that glslc takes. The files must come from these
# sources: nothing here can tell.
set(ANVIL_SPIRV_FROM "" CACHE PATH "generated/shaders of another build of these sources, whose SPIR-V to reuse")

# name source defines (pipelines.c's table takes each as spv_NAME, from generated/shaders/spirv.inc;
# a weight type's variants are named by its lower-case name, VK_WEIGHT_TYPES in vulkan_impl.h)
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
  "matvec_q2_k matvec.comp -DW_Q2_K"
  "matvec_q3_k matvec.comp -DW_Q3_K"
  "matvec_iq4_nl matvec.comp -DW_IQ4_NL"
  "matvec_iq4_xs matvec.comp -DW_IQ4_XS"
  "matvec_iq3_xxs matvec.comp -DW_IQ3_XXS"
  "matvec_iq3_s matvec.comp -DW_IQ3_S"
  "matvec_iq2_xxs matvec.comp -DW_IQ2_XXS"
  "matvec_iq2_xs matvec.comp -DW_IQ2_XS"
  "matvec_iq2_s matvec.comp -DW_IQ2_S"
  "matvec_iq1_s matvec.comp -DW_IQ1_S"
  "matvec_iq1_m matvec.comp -DW_IQ1_M"
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
  "embed_q2_k embed.comp -DW_Q2_K"
  "embed_q3_k embed.comp -DW_Q3_K"
  "embed_iq4_nl embed.comp -DW_IQ4_NL"
  "embed_iq4_xs embed.comp -DW_IQ4_XS"
  "embed_iq3_xxs embed.comp -DW_IQ3_XXS"
  "embed_iq3_s embed.comp -DW_IQ3_S"
  "embed_iq2_xxs embed.comp -DW_IQ2_XXS"
  "embed_iq2_xs embed.comp -DW_IQ2_XS"
  "embed_iq2_s embed.comp -DW_IQ2_S"
  "embed_iq1_s embed.comp -DW_IQ1_S"
  "embed_iq1_m embed.comp -DW_IQ1_M"
  "attention attention.comp -DANVIL"
  "argmax argmax.comp -DANVIL"
  "ew ew.comp -DANVIL"
  "prefetch prefetch.comp -DANVIL"
  "moe_topk moe_topk.comp -DANVIL"
  "moe_rows moe_rows.comp -DANVIL"
  "gdn gdn.comp -DANVIL"
  "gdn_chunk gdn_chunk.comp -DANVIL"
  "sample sample.comp -DANVIL"
  "logprobs logprobs.comp -DANVIL"
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
  "mm_q2_k mm.comp -DW_Q2_K"
  "mm_q3_k mm.comp -DW_Q3_K"
  "mm_iq4_nl mm.comp -DW_IQ4_NL"
  "mm_iq4_xs mm.comp -DW_IQ4_XS"
  "mm_iq3_xxs mm.comp -DW_IQ3_XXS"
  "mm_iq3_s mm.comp -DW_IQ3_S"
  "mm_iq2_xxs mm.comp -DW_IQ2_XXS"
  "mm_iq2_xs mm.comp -DW_IQ2_XS"
  "mm_iq2_s mm.comp -DW_IQ2_S"
  "mm_iq1_s mm.comp -DW_IQ1_S"
  "mm_iq1_m mm.comp -DW_IQ1_M"
  "rows rows.comp -DANVIL"
  "attn_prefill attn_prefill.comp -DANVIL"
  "vit vit.comp -DANVIL"
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
  "dq_q2_k dq.comp -DW_Q2_K"
  "dq_q3_k dq.comp -DW_Q3_K"
  "dq_iq4_nl dq.comp -DW_IQ4_NL"
  "dq_iq4_xs dq.comp -DW_IQ4_XS"
  "dq_iq3_xxs dq.comp -DW_IQ3_XXS"
  "dq_iq3_s dq.comp -DW_IQ3_S"
  "dq_iq2_xxs dq.comp -DW_IQ2_XXS"
  "dq_iq2_xs dq.comp -DW_IQ2_XS"
  "dq_iq2_s dq.comp -DW_IQ2_S"
  "dq_iq1_s dq.comp -DW_IQ1_S"
  "dq_iq1_m dq.comp -DW_IQ1_M"
  "mm_h_64x64_k32 mm_h.comp -DWM=2u -DTM=2u -DTN=1u -DBK=32u"
  "mm_h_moe mm_h.comp -DWM=1u -DTM=2u -DTN=1u -DBK=32u -DGATHER"
  "attn_flash attn_flash.comp -DANVIL"
  "attn_split attn_split.comp -DANVIL"
  "vit_flash vit_flash.comp -DANVIL"
  "vit_flash1 vit_flash.comp -DONE_PASS"
  "vit_flash1_bk64 vit_flash.comp -DONE_PASS -DBK64"
  "qx qx.comp -DANVIL"
  "matvec_qx_q8_0 matvec.comp -DW_Q8_0 -DQX -DQWIDE8"
  "matvec_qx_q6_k matvec.comp -DW_Q6_K -DQX"
  "matvec_qxv_q8_0 matvec.comp -DW_Q8_0 -DQX -DQXV -DQWIDE8"
  "matvec_qxt_q8_0 matvec.comp -DW_Q8_0 -DQX -DQXV -DQXT -DQWIDE8"
  "matvec_qx_q4_k matvec.comp -DW_Q4_K -DQX -DQWIDE"
  "matvec_qxv_q4_k matvec.comp -DW_Q4_K -DQX -DQXV -DQWIDE"
  "matvec_qxt_q4_k matvec.comp -DW_Q4_K -DQX -DQXV -DQXT -DQWIDE"
  "matvec_qx_q5_k matvec.comp -DW_Q5_K -DQX -DQWIDE"
  "matvec_qxv_q5_k matvec.comp -DW_Q5_K -DQX -DQXV -DQWIDE"
  "matvec_qxt_q5_k matvec.comp -DW_Q5_K -DQX -DQXV -DQXT -DQWIDE"
  "matvec_qxv_q6_k matvec.comp -DW_Q6_K -DQX -DQXV"
  "matvec_qxt_q6_k matvec.comp -DW_Q6_K -DQX -DQXV -DQXT"
  "matvec_qx_q2_k matvec.comp -DW_Q2_K -DQX"
  "matvec_qxv_q2_k matvec.comp -DW_Q2_K -DQX -DQXV"
  "matvec_qxt_q2_k matvec.comp -DW_Q2_K -DQX -DQXV -DQXT"
  "matvec_qx_q3_k matvec.comp -DW_Q3_K -DQX"
  "matvec_qxv_q3_k matvec.comp -DW_Q3_K -DQX -DQXV"
  "matvec_qxt_q3_k matvec.comp -DW_Q3_K -DQX -DQXV -DQXT"
  "matvec_qx_iq4_nl matvec.comp -DW_IQ4_NL -DQX"
  "matvec_qxv_iq4_nl matvec.comp -DW_IQ4_NL -DQX -DQXV"
  "matvec_qxt_iq4_nl matvec.comp -DW_IQ4_NL -DQX -DQXV -DQXT"
  "matvec_qx_iq4_xs matvec.comp -DW_IQ4_XS -DQX"
  "matvec_qxv_iq4_xs matvec.comp -DW_IQ4_XS -DQX -DQXV"
  "matvec_qxt_iq4_xs matvec.comp -DW_IQ4_XS -DQX -DQXV -DQXT"
  "matvec_qx_iq3_xxs matvec.comp -DW_IQ3_XXS -DQX"
  "matvec_qxv_iq3_xxs matvec.comp -DW_IQ3_XXS -DQX -DQXV"
  "matvec_qxt_iq3_xxs matvec.comp -DW_IQ3_XXS -DQX -DQXV -DQXT"
  "matvec_qx_iq3_s matvec.comp -DW_IQ3_S -DQX"
  "matvec_qxv_iq3_s matvec.comp -DW_IQ3_S -DQX -DQXV"
  "matvec_qxt_iq3_s matvec.comp -DW_IQ3_S -DQX -DQXV -DQXT"
  "matvec_qx_iq2_xxs matvec.comp -DW_IQ2_XXS -DQX"
  "matvec_qxv_iq2_xxs matvec.comp -DW_IQ2_XXS -DQX -DQXV"
  "matvec_qxt_iq2_xxs matvec.comp -DW_IQ2_XXS -DQX -DQXV -DQXT"
  "matvec_qx_iq2_xs matvec.comp -DW_IQ2_XS -DQX"
  "matvec_qxv_iq2_xs matvec.comp -DW_IQ2_XS -DQX -DQXV"
  "matvec_qxt_iq2_xs matvec.comp -DW_IQ2_XS -DQX -DQXV -DQXT"
  "matvec_qx_iq2_s matvec.comp -DW_IQ2_S -DQX"
  "matvec_qxv_iq2_s matvec.comp -DW_IQ2_S -DQX -DQXV"
  "matvec_qxt_iq2_s matvec.comp -DW_IQ2_S -DQX -DQXV -DQXT"
  "matvec_qx_iq1_s matvec.comp -DW_IQ1_S -DQX"
  "matvec_qxv_iq1_s matvec.comp -DW_IQ1_S -DQX -DQXV"
  "matvec_qxt_iq1_s matvec.comp -DW_IQ1_S -DQX -DQXV -DQXT"
  "matvec_qx_iq1_m matvec.comp -DW_IQ1_M -DQX"
  "matvec_qxv_iq1_m matvec.comp -DW_IQ1_M -DQX -DQXV"
  "matvec_qxt_iq1_m matvec.comp -DW_IQ1_M -DQX -DQXV -DQXT"
  "matvec_route_f32 matvec.comp -DW_F32 -DROUTE"
  "matvec_route_f16 matvec.comp -DW_F16 -DROUTE"
  "matvec_route_bf16 matvec.comp -DW_BF16 -DROUTE"
  "moe_down_r_q8_0 matvec.comp -DW_Q8_0 -DMDR"
  "moe_down_r_q4_k matvec.comp -DW_Q4_K -DMDR"
  "moe_down_r_q5_k matvec.comp -DW_Q5_K -DMDR"
  "moe_down_r_q6_k matvec.comp -DW_Q6_K -DMDR"
  "mega_f32 mega.comp -DW_F32"
  "mega_f16 mega.comp -DW_F16"
  "mega_bf16 mega.comp -DW_BF16"
  "mega_bf16_clk mega.comp -DW_BF16 -DCLOCK"
  "mega_qx mega.comp -DMQX -DQX"
  "mega_qx_clk mega.comp -DMQX -DQX -DCLOCK"
  "mmb_f32 mmb.comp -DW_F32"
  "mmb_f16 mmb.comp -DW_F16"
  "mmb_bf16 mmb.comp -DW_BF16"
  "mmb_q8_0 mmb.comp -DW_Q8_0"
  "mmb_q4_0 mmb.comp -DW_Q4_0"
  "mmb_q4_1 mmb.comp -DW_Q4_1"
  "mmb_q5_0 mmb.comp -DW_Q5_0"
  "mmb_q5_1 mmb.comp -DW_Q5_1"
  "mmb_q4_k mmb.comp -DW_Q4_K"
  "mmb_q5_k mmb.comp -DW_Q5_K"
  "mmb_q6_k mmb.comp -DW_Q6_K"
  "mmb_q2_k mmb.comp -DW_Q2_K"
  "mmb_q3_k mmb.comp -DW_Q3_K"
  "mmb_iq4_nl mmb.comp -DW_IQ4_NL"
  "mmb_iq4_xs mmb.comp -DW_IQ4_XS"
  "mmb_iq3_xxs mmb.comp -DW_IQ3_XXS"
  "mmb_iq3_s mmb.comp -DW_IQ3_S"
  "mmb_iq2_xxs mmb.comp -DW_IQ2_XXS"
  "mmb_iq2_xs mmb.comp -DW_IQ2_XS"
  "mmb_iq2_s mmb.comp -DW_IQ2_S"
  "mmb_iq1_s mmb.comp -DW_IQ1_S"
  "mmb_iq1_m mmb.comp -DW_IQ1_M"
  "mmb_qx_q8_0 mmb.comp -DW_Q8_0 -DQX -DQWIDE8"
  "mmb_qx_q4_k mmb.comp -DW_Q4_K -DQX -DQWIDE"
  "mmb_qx_q5_k mmb.comp -DW_Q5_K -DQX -DQWIDE"
  "mmb_qx_q6_k mmb.comp -DW_Q6_K -DQX"
  "mmb_qx_q2_k mmb.comp -DW_Q2_K -DQX"
  "mmb_qx_q3_k mmb.comp -DW_Q3_K -DQX"
  "mmb_qx_iq4_nl mmb.comp -DW_IQ4_NL -DQX"
  "mmb_qx_iq4_xs mmb.comp -DW_IQ4_XS -DQX"
  "mmb_qx_iq3_xxs mmb.comp -DW_IQ3_XXS -DQX"
  "mmb_qx_iq3_s mmb.comp -DW_IQ3_S -DQX"
  "mmb_qx_iq2_xxs mmb.comp -DW_IQ2_XXS -DQX"
  "mmb_qx_iq2_xs mmb.comp -DW_IQ2_XS -DQX"
  "mmb_qx_iq2_s mmb.comp -DW_IQ2_S -DQX"
  "mmb_qx_iq1_s mmb.comp -DW_IQ1_S -DQX"
  "mmb_qx_iq1_m mmb.comp -DW_IQ1_M -DQX"
  "mmbt_q8_0 mmbt.comp -DW_Q8_0 -DQX"
  "mmbt_q4_k mmbt.comp -DW_Q4_K -DQX"
  "mmbt_q5_k mmbt.comp -DW_Q5_K -DQX"
  "mmbt_q6_k mmbt.comp -DW_Q6_K -DQX"
  "mmb_round mmb_round.comp -DROUND")
set(ANVIL_SHADER_INCS)
set(ANVIL_SPIRV_INC "/* generated by src/backends/vulkan/module.cmake: every SPIR-V variant by name */\n")
file(GLOB ANVIL_SHADER_DEPS CONFIGURE_DEPENDS ${ANVIL_VK_DIR}/shaders/*.glsl ${ANVIL_VK_DIR}/shaders/*.comp
     ${ANVIL_VK_DIR}/shaders/*.h)
foreach(v ${ANVIL_SHADER_VARIANTS})
  separate_arguments(parts UNIX_COMMAND "${v}")
  list(GET parts 0 name)
  list(GET parts 1 src)
  list(SUBLIST parts 2 -1 defs)
  if(ANVIL_SPIRV_FROM)
    add_custom_command(
      OUTPUT ${ANVIL_SHADER_OUT}/${name}.inc
      COMMAND ${CMAKE_COMMAND} -E copy ${ANVIL_SPIRV_FROM}/${name}.inc ${ANVIL_SHADER_OUT}/${name}.inc
      DEPENDS ${ANVIL_SPIRV_FROM}/${name}.inc
      COMMENT "SPIR-V ${name} (from ${ANVIL_SPIRV_FROM})")
  else()
    add_custom_command(
      OUTPUT ${ANVIL_SHADER_OUT}/${name}.inc
      COMMAND ${GLSLC} --target-env=vulkan1.2 -O -mfmt=c ${defs} -o ${ANVIL_SHADER_OUT}/${name}.inc ${ANVIL_VK_DIR}/shaders/${src}
      DEPENDS ${ANVIL_SHADER_DEPS}
      COMMENT "glslc ${name}")
  endif()
  list(APPEND ANVIL_SHADER_INCS ${ANVIL_SHADER_OUT}/${name}.inc)
  string(APPEND ANVIL_SPIRV_INC "static const uint32_t spv_${name}[] =\n#include \"${name}.inc\"\n    ;\n")
endforeach()
file(CONFIGURE OUTPUT ${ANVIL_SHADER_OUT}/spirv.inc CONTENT "${ANVIL_SPIRV_INC}" @ONLY)
add_custom_target(anvil_shaders DEPENDS ${ANVIL_SHADER_INCS})
list(APPEND ANVIL_OBJ_DEPENDS anvil_shaders)

# volk ships as a header plus volk.c (libvulkan-volk-dev); it is compiled into the library.
list(APPEND ANVIL_SOURCES /usr/include/volk.c)
set_source_files_properties(/usr/include/volk.c PROPERTIES COMPILE_OPTIONS "-w")
add_compile_definitions(VK_NO_PROTOTYPES)
list(APPEND ANVIL_DEPS ${CMAKE_DL_LIBS})
