"""Tiny versions of the models the export tools read, built from configs with seeded random weights
(nothing is downloaded) and saved as the folders the real checkpoints come in:

  <out>/sd3/        text_encoder (CLIP-L), text_encoder_2 (CLIP-G), text_encoder_3 (T5), tokenizer{,_2,_3}, vae
  <out>/wan/        text_encoder (UMT5), tokenizer, vae (AutoencoderKLWan)
  <out>/qwen_image/ text_encoder (Qwen2.5-VL), tokenizer, vae (AutoencoderKLQwenImage)
  <out>/flux/       text_encoder (CLIP-L, CLIPTextModel), text_encoder_2 (T5), tokenizer{,_2}, vae (AutoencoderKL)
  <out>/flux2/      text_encoder (Qwen3, 28 layers: FLUX.2 [klein] reads layers 9, 18, 27), tokenizer
                    with a Qwen3-style chat template, vae (AutoencoderKLFlux2, 32 channels)
  <out>/flux2_dev/  text_encoder (Mistral3ForConditionalGeneration, 32 text layers: FLUX.2-dev reads 10, 20,
                    30), tokenizer (PixtralProcessor with a Mistral-Small-3-style chat template)
  <out>/pickscore/  CLIPModel (the PickScore architecture);  <out>/processor/  its CLIPProcessor
  <out>/<family>/ditrl_config.json   the DiT config ditrl builds (text widths matching the encoders)

The tokenizers are character-level WordLevel tokenizers (the `tokenizers` library) saved in the
transformers format, so AutoTokenizer / the pipelines load them like the real ones.
"""

import json
import os
import string
import sys

import torch

LATENT_CHANNELS = 16  # the real VAEs': ditrl's latents are [N, 16, (F,) H, W]
FLUX2_LATENT_CHANNELS = 32  # FLUX.2's VAE; ditrl's flux2 latents are it patchified 2x2, [N, 128, H/2, W/2]


def tokenizer(max_length, bos=True):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3}
    for ch in string.ascii_letters + string.digits + " ,.:;!?<>|_-'\"\n":
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    template = "<s> $A </s>" if bos else "$A </s>"
    tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=[("<s>", 2), ("</s>", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=max_length)


def seeded(module, seed):
    # Every weight drawn (not the libraries' zero/one inits), so each one changes the outputs.
    # Matrices N(0, 0.25 / fan_in), vectors 0.05 N(0, 1) around their init (norm weights stay near 1).
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * (0.25 / p[0].numel()) ** 0.5)
            else:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return module.eval()


def clip_text(hidden, projection, seed):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection
    config = CLIPTextConfig(vocab_size=100, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                            num_attention_heads=2, max_position_embeddings=77, projection_dim=projection,
                            pad_token_id=0, bos_token_id=2, eos_token_id=3)
    return seeded(CLIPTextModelWithProjection(config), seed)


def sd3(out):
    from diffusers import AutoencoderKL
    from transformers import T5Config, T5EncoderModel
    clip_l, clip_g = clip_text(16, 16, 1), clip_text(24, 16, 2)
    t5 = seeded(T5EncoderModel(T5Config(vocab_size=100, d_model=48, d_kv=24, d_ff=64, num_layers=2, num_heads=2,
                                        pad_token_id=0, eos_token_id=3)), 3)
    for sub, model in (("text_encoder", clip_l), ("text_encoder_2", clip_g), ("text_encoder_3", t5)):
        model.save_pretrained(os.path.join(out, sub))
    tokenizer(77).save_pretrained(os.path.join(out, "tokenizer"))
    tokenizer(77).save_pretrained(os.path.join(out, "tokenizer_2"))
    tokenizer(256, bos=False).save_pretrained(os.path.join(out, "tokenizer_3"))
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=8, scaling_factor=1.5305,
                        shift_factor=0.0609)
    seeded(vae, 4).save_pretrained(os.path.join(out, "vae"))
    # The DiT: text width = T5's d_model, pooled = CLIP-L + CLIP-G projections.
    return {"_class_name": "SD3Transformer2DModel", "sample_size": 16, "patch_size": 2,
            "in_channels": LATENT_CHANNELS, "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
            "joint_attention_dim": 48, "caption_projection_dim": 32, "pooled_projection_dim": 32,
            "out_channels": LATENT_CHANNELS, "pos_embed_max_size": 16, "dual_attention_layers": [],
            "qk_norm": "rms_norm"}


def wan(out):
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config, UMT5EncoderModel
    umt5 = seeded(UMT5EncoderModel(UMT5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                              num_heads=2, pad_token_id=0, eos_token_id=3)), 5)
    umt5.save_pretrained(os.path.join(out, "text_encoder"))
    tokenizer(512, bos=False).save_pretrained(os.path.join(out, "tokenizer"))
    vae = AutoencoderKLWan(base_dim=8, z_dim=LATENT_CHANNELS, dim_mult=[1, 2], num_res_blocks=1,
                           temperal_downsample=[False], latents_mean=[0.1 * i for i in range(LATENT_CHANNELS)],
                           latents_std=[1.0 + 0.05 * i for i in range(LATENT_CHANNELS)])
    seeded(vae, 6).save_pretrained(os.path.join(out, "vae"))
    return {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "num_attention_heads": 2,
            "attention_head_dim": 16, "in_channels": LATENT_CHANNELS, "out_channels": LATENT_CHANNELS,
            "text_dim": 32, "freq_dim": 32, "ffn_dim": 64, "num_layers": 2, "cross_attn_norm": True,
            "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 1024}


def qwen_image(out):
    from diffusers import AutoencoderKLQwenImage
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": 100, "hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 1024,
                     "rope_scaling": {"type": "mrope", "mrope_section": [2, 4, 6]}, "pad_token_id": 0,
                     "bos_token_id": 2, "eos_token_id": 3},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 48,
                       "fullatt_block_indexes": [0]},
        pad_token_id=0, bos_token_id=2, eos_token_id=3)
    seeded(Qwen2_5_VLForConditionalGeneration(config), 7).save_pretrained(os.path.join(out, "text_encoder"))
    tokenizer(1024, bos=False).save_pretrained(os.path.join(out, "tokenizer"))
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=LATENT_CHANNELS, dim_mult=[1, 2], num_res_blocks=1,
                                 temperal_downsample=[False], latents_mean=[0.1 * i for i in range(LATENT_CHANNELS)],
                                 latents_std=[1.0 + 0.05 * i for i in range(LATENT_CHANNELS)])
    seeded(vae, 8).save_pretrained(os.path.join(out, "vae"))
    return {"_class_name": "QwenImageTransformer2DModel", "patch_size": 2, "in_channels": 4 * LATENT_CHANNELS,
            "out_channels": LATENT_CHANNELS, "num_layers": 2, "attention_head_dim": 32, "num_attention_heads": 2,
            "joint_attention_dim": 48, "axes_dims_rope": [8, 12, 12], "guidance_embeds": False}


def flux(out):
    from diffusers import AutoencoderKL
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel
    clip_l = seeded(CLIPTextModel(CLIPTextConfig(vocab_size=100, hidden_size=16, intermediate_size=32,
                                                 num_hidden_layers=2, num_attention_heads=2,
                                                 max_position_embeddings=77, pad_token_id=0, bos_token_id=2,
                                                 eos_token_id=3)), 10)
    t5 = seeded(T5EncoderModel(T5Config(vocab_size=100, d_model=48, d_kv=24, d_ff=64, num_layers=2, num_heads=2,
                                        pad_token_id=0, eos_token_id=3)), 11)
    clip_l.save_pretrained(os.path.join(out, "text_encoder"))
    t5.save_pretrained(os.path.join(out, "text_encoder_2"))
    tokenizer(77).save_pretrained(os.path.join(out, "tokenizer"))
    tokenizer(512, bos=False).save_pretrained(os.path.join(out, "tokenizer_2"))
    # FLUX.1's VAE config: 16 channels, scaling 0.3611, shift 0.1159.
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=8, scaling_factor=0.3611,
                        shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False)
    seeded(vae, 12).save_pretrained(os.path.join(out, "vae"))
    # The DiT: text width = T5's d_model, pooled = CLIP-L's hidden size; 2x2-packed latents.
    return {"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 4 * LATENT_CHANNELS,
            "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16, "num_attention_heads": 2,
            "joint_attention_dim": 48, "pooled_projection_dim": 16, "guidance_embeds": True,
            "axes_dims_rope": [4, 6, 6]}
# Qwen3's chat template as the FLUX.2 [klein] pipeline calls it (enable_thinking=False adds an empty
# think block to the generation prompt).
QWEN3_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def flux2(out):
    from diffusers import AutoencoderKLFlux2
    from transformers import Qwen3Config, Qwen3ForCausalLM
    config = Qwen3Config(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=28,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=1024,
                         pad_token_id=0, bos_token_id=2, eos_token_id=3)
    seeded(Qwen3ForCausalLM(config), 10).save_pretrained(os.path.join(out, "text_encoder"))
    tok = tokenizer(1024, bos=False)
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    tok.save_pretrained(os.path.join(out, "tokenizer"))
    vae = seeded(AutoencoderKLFlux2(in_channels=3, out_channels=3, latent_channels=FLUX2_LATENT_CHANNELS,
                                    down_block_types=("DownEncoderBlock2D",) * 2,
                                    up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16),
                                    layers_per_block=1, norm_num_groups=8), 14)
    # Drawn batch-norm statistics (the de-normalisation Flux2Pipeline applies), not the identity 0 / 1.
    g = torch.Generator().manual_seed(15)
    vae.bn.running_mean.copy_(0.3 * torch.randn(vae.bn.running_mean.shape, generator=g))
    vae.bn.running_var.copy_(0.5 + torch.rand(vae.bn.running_var.shape, generator=g))
    vae.save_pretrained(os.path.join(out, "vae"))
    # The DiT: text width = 3 stacked Qwen3 layers x 16.
    return flux2_dit()


def flux2_dit():
    return {"_class_name": "Flux2Transformer2DModel", "patch_size": 1, "in_channels": 4 * FLUX2_LATENT_CHANNELS,
            "out_channels": None, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16,
            "num_attention_heads": 2, "joint_attention_dim": 48, "timestep_guidance_channels": 32, "mlp_ratio": 3.0,
            "axes_dims_rope": [4, 4, 4, 4], "rope_theta": 2000, "eps": 1e-6, "guidance_embeds": False}


# Mistral-Small-3's chat template as FLUX.2-dev's pipeline calls it: bos, the system message in
# [SYSTEM_PROMPT] tags, each user turn in [INST] tags (content as a list of typed blocks).
MISTRAL3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% set text = m.content if m.content is string else m.content | map(attribute='text') | join('') %}"
    "{% if m.role == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% elif m.role == 'user' %}[INST]{{ text }}[/INST]{% else %}{{ text }}{{ eos_token }}{% endif %}"
    "{% endfor %}")
MISTRAL3_SPECIAL = ["[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]


def flux2_dev(out):
    from tokenizers import AddedToken
    from transformers import (Mistral3Config, Mistral3ForConditionalGeneration, PixtralImageProcessor,
                              PixtralProcessor)
    tok = tokenizer(1024, bos=False)
    tok.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True) for t in MISTRAL3_SPECIAL]})
    # 32 text layers so that layer 30, the last FLUX.2-dev reads, is not the final (normed) state.
    config = Mistral3Config(
        text_config={"model_type": "mistral", "vocab_size": 100, "hidden_size": 16, "intermediate_size": 32,
                     "num_hidden_layers": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                     "max_position_embeddings": 1024, "sliding_window": None, "pad_token_id": 0, "bos_token_id": 2,
                     "eos_token_id": 3},
        vision_config={"model_type": "pixtral", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "head_dim": 8, "image_size": 32, "patch_size": 8},
        image_token_index=tok.convert_tokens_to_ids("[IMG]"), spatial_merge_size=1)
    seeded(Mistral3ForConditionalGeneration(config), 13).save_pretrained(os.path.join(out, "text_encoder"))
    PixtralProcessor(image_processor=PixtralImageProcessor(patch_size=8), tokenizer=tok, patch_size=8,
                     spatial_merge_size=1, chat_template=MISTRAL3_CHAT_TEMPLATE).save_pretrained(
        os.path.join(out, "tokenizer"))
    # The DiT: text width = 3 stacked Mistral layers x 16.
    return flux2_dit()


def pickscore(out):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor
    config = CLIPConfig(text_config={"vocab_size": 100, "hidden_size": 16, "intermediate_size": 32,
                                     "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 77,
                                     "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3},
                        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                       "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
                        projection_dim=16)
    seeded(CLIPModel(config), 9).save_pretrained(os.path.join(out, "pickscore"))
    CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size=32),
                  tokenizer=tokenizer(77)).save_pretrained(os.path.join(out, "processor"))


def main(out, families):
    torch.manual_seed(0)
    builders = {"sd3": sd3, "wan": wan, "qwen_image": qwen_image, "flux": flux, "flux2": flux2,
                "flux2_dev": flux2_dev}
    for family in families:
        folder = os.path.join(out, family)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "ditrl_config.json"), "w") as f:
            json.dump(builders[family](folder), f, indent=1)
    pickscore(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["sd3", "wan", "qwen_image"])
