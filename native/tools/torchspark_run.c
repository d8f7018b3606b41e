/* torchspark_run.c: the torchspark-run CLI (placeholder until the agent lands). */
#include <stdio.h>
#include "torchspark/common.h"
int main(void)
{
    printf("torchspark-run %s\n", tsp_version());
    return 0;
}
