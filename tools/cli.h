/* The subcommands of the qkv tool, one file each (tools/cmd_<name>.c).
 * Each takes the arguments after "qkv" (argv[0] is the subcommand's name) and
 * returns the process exit status: 0 success, 1 failure, 2 usage error. */
#ifndef QKV_CLI_H
#define QKV_CLI_H

int cli_cmd_demo(int argc, char **argv); /* qkv demo: the articles' walkthrough on a model trained now */
int cli_cmd_show(int argc, char **argv); /* qkv show: every layer's and head's attention on one input */
int cli_cmd_experiment(int argc, char **argv); /* qkv experiment: the articles' questions, measured */
/* qkv attend: attention (forward, and backward with --grad-out) on .npy files. */
int cli_cmd_attend(int argc, char **argv);
/* qkv mha: a multi-head attention layer (safetensors weights) on .npy files. */
int cli_cmd_mha(int argc, char **argv);
/* qkv train / eval / generate: transformers trained on tasks or text. */
int cli_cmd_train(int argc, char **argv);
int cli_cmd_eval(int argc, char **argv);
int cli_cmd_generate(int argc, char **argv);

/* qkv image: one pixel's self-attention over an image, drawn as a heat overlay. */
int cli_cmd_image(int argc, char **argv);

/* qkv conv-as-attention: a convolution as multi-head self-attention, on .npy files. */
int cli_cmd_conv_as_attention(int argc, char **argv);

/* qkv complexity: the complexity table of self-attention, recurrent and convolutional layers, measured. */
int cli_cmd_complexity(int argc, char **argv);

/* qkv embed / tokenize / similarity / search: a pretrained BERT-family encoder on texts. */
int cli_cmd_embed(int argc, char **argv);
int cli_cmd_tokenize(int argc, char **argv);
int cli_cmd_similarity(int argc, char **argv);
int cli_cmd_search(int argc, char **argv);

#endif
